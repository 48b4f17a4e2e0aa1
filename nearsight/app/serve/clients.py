"""Who a request comes from: one client identity for the wrong-key slowdown, the connection
caps, the fair shares of heavy work and the access log.

A client is the address of its socket. Only when the operator names the proxies in front of
the server (``--forwarded-allow-ips``, spelled as uvicorn and gunicorn spell it: addresses or
networks, comma-separated, ``*`` for any) does a request from one of them count as the
address its ``X-Forwarded-For`` names (the right-most entry that is not itself a trusted
proxy, and only if it is an IP address), with its scheme from ``X-Forwarded-Proto``. Off by
default: a header is a claim, and anyone can send one.

uvicorn (under Gradio) trusts ``X-Forwarded-For`` from 127.0.0.1 by default and rewrites
``scope["client"]`` before any middleware sees it, so the server runs it with
``proxy_headers=False`` (nearsight/app/serve/slow_clients.py) and the guard decides.

The guard (nearsight/app/serve/guard.py) sets the identity on the scope and in
:data:`CURRENT_CLIENT` for the rest of the request (the work gates read it there).
"""

from __future__ import annotations

import contextvars
import ipaddress
from collections.abc import Iterable
from typing import Any

from nearsight.core.errors import NearsightError

ANY = "*"
# the identity of the request being served (set by the guard; "" outside a request)
CURRENT_CLIENT: contextvars.ContextVar[str] = contextvars.ContextVar("nearsight_client", default="")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class TrustedProxies:
    """The proxies whose ``X-Forwarded-For`` and ``X-Forwarded-Proto`` are believed."""

    def __init__(self, spec: str | Iterable[str] = ""):
        names = spec.split(",") if isinstance(spec, str) else list(spec)
        names = [name.strip() for name in names if name.strip()]
        self.any = ANY in names
        self.networks: list[Network] = []
        for name in names:
            if name == ANY:
                continue
            try:
                self.networks.append(ipaddress.ip_network(name, strict=False))
            except ValueError:
                raise NearsightError(
                    f"--forwarded-allow-ips: {name!r} is not an IP address or network "
                    "(e.g. 10.0.0.5,192.168.0.0/24 or *)"
                ) from None

    def __bool__(self) -> bool:
        return self.any or bool(self.networks)

    def trusts(self, address: str) -> bool:
        if self.any:
            return True
        ip = _ip(address)
        return ip is not None and any(ip in network for network in self.networks)

    def describe(self) -> str:
        return ANY if self.any else ",".join(str(n) for n in self.networks) or "none"


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    text = text.strip()
    if text.startswith("[") and "]" in text:  # [v6]:port
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:  # v4:port
        text = text.partition(":")[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


IDENTITY_HEADER = b"x-nearsight-identity"  # set by the guard (a client's own is dropped)


def network_of(address: str) -> str:
    """Who an address is for the fair shares and the connection caps: its network, /24 for
    IPv4 and /64 for IPv6 (one machine or site holds many addresses of one network, rarely
    many networks); the text itself when it is not an address."""
    ip = _ip(address)
    if ip is None:
        return address
    prefix = 24 if ip.version == 4 else 64
    return str(ipaddress.ip_network(f"{ip}/{prefix}", strict=False))


def socket_address(scope: dict[str, Any]) -> str:
    return (scope.get("client") or ("", 0))[0] or ""


def identify(scope: dict[str, Any], trusted: TrustedProxies) -> tuple[str, str | None]:
    """(client address, scheme the proxy reports or None) of a request whose socket peer is
    ``scope["client"]``: the socket's address unless it is a trusted proxy's."""
    peer = socket_address(scope)
    if not trusted or not trusted.trusts(peer):
        return peer, None
    forwarded: list[str] = []
    proto = None
    for name, value in scope.get("headers", ()):
        if name == b"x-forwarded-for":
            forwarded.extend(value.decode("latin-1").split(","))
        elif name == b"x-forwarded-proto":
            proto = value.decode("latin-1").strip().lower()
    client = peer
    for entry in reversed(forwarded):  # the nearest hop first
        ip = _ip(entry)
        if ip is None:  # not an address: stop believing the chain here
            break
        client = str(ip)
        if not trusted.trusts(client):
            break
    return client, proto if proto in ("http", "https") else None


def log_field(text: str, limit: int = 200) -> str:
    """A field of the access log: control characters and spaces escaped (so a field can neither
    start a line nor pass for two fields), quotes and backslashes too, at most ``limit``
    characters; "-" when empty."""
    if not text:
        return "-"
    out = []
    for char in text[:limit]:
        if char == " ":
            out.append("\\x20")
        elif char in '"\\':
            out.append("\\" + char)
        elif not char.isprintable():
            out.append(char.encode("unicode_escape").decode("ascii"))
        else:
            out.append(char)
    return "".join(out) + ("..." if len(text) > limit else "")


def identify_scope(scope: dict[str, Any], trusted: TrustedProxies) -> None:
    """The request's client from here on (nearsight/app/serve/clients.py): its socket's address,
    or the one a trusted proxy forwards; every later reader of ``scope["client"]`` (Gradio,
    the REST API, the work gates through CURRENT_CLIENT) sees the same."""
    if "nearsight.peer" in scope:  # identified already (a mounted app's scope is a copy)
        CURRENT_CLIENT.set(identity_of(scope))
        return
    peer = socket_address(scope)
    scope["nearsight.peer"] = peer
    client, scheme = identify(scope, trusted)
    if client != peer:
        scope["client"] = (client, 0)
    if scheme is not None:
        scope["scheme"] = scheme if scope["type"] == "http" else scheme.replace("http", "ws")
    set_identity(scope, network_of(client))


def set_identity(scope: dict[str, Any], identity: str) -> None:
    """Who the request is for the fair shares from here on: in CURRENT_CLIENT (the REST
    gates) and in a header of its own (the page's gates read it on Gradio's request); a
    header of that name the client sent is dropped."""
    scope["nearsight.identity"] = identity
    headers = [(n, v) for n, v in scope.get("headers", ()) if n != IDENTITY_HEADER]
    scope["headers"] = [*headers, (IDENTITY_HEADER, identity.encode("latin-1", "replace"))]
    CURRENT_CLIENT.set(identity)


def identity_of(scope: dict[str, Any]) -> str:
    """Who a request is for the fair shares: its key's holder (named keys), else its client's
    network (nearsight/app/serve/clients.py: network_of)."""
    return scope.get("nearsight.identity") or network_of(client_of(scope))


def client_of(scope: dict[str, Any]) -> str:
    return (scope.get("client") or ("", 0))[0]
