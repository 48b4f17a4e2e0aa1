"""Which ``Host`` and ``Origin`` a request may name (DNS rebinding, cross-site requests).

A web page on another site can make a browser send requests to ``127.0.0.1:7860`` (its
``Origin`` is the other site) or, after rebinding its own name to 127.0.0.1, requests whose
``Host`` is that name. The guard refuses both before any route: a ``Host`` outside
:class:`AllowedHosts` gets 400, an ``Origin`` that is not one of the server's own origins (an
allowed host, on the scheme and port the request's ``Host`` and scheme give; a page on another
port of the same host is another origin) gets 403, so no answer (and no CORS header) ever reaches a page of
another site. Behind a TLS proxy, name it in ``--forwarded-allow-ips`` so that its
``X-Forwarded-Proto`` gives the scheme, and let it pass the ``Host`` through.

By default the allowed hosts are the loopback names when the server listens on a loopback
address; the address itself when it listens on one other address; and this machine's names
and addresses when it listens on all of them (``0.0.0.0``, ``::``). ``--allowed-hosts`` adds
names (a reverse proxy's, a DNS name); ``*`` turns the check off.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
ANY_HOST = "*"
WILDCARD_ADDRESSES = ("0.0.0.0", "::", "")


def host_name(value: str) -> str:
    """The host of a ``Host`` header or of a URL's authority: no port, no brackets, lower case,
    no trailing dot."""
    value = value.strip().lower()
    if value.startswith("["):  # [v6]:port
        return value[1 : value.find("]")] if "]" in value else value
    if value.count(":") == 1:  # name:port (a bare IPv6 address has several colons)
        value = value.partition(":")[0]
    return value.rstrip(".")


class AllowedHosts:
    def __init__(self, names: Iterable[str]):
        cleaned = {host_name(name) for name in names if name.strip()}
        self.any = ANY_HOST in cleaned
        self.names = frozenset(cleaned - {ANY_HOST})

    @classmethod
    def for_server(cls, bound: str, extra: Iterable[str] = ()) -> AllowedHosts:
        """The defaults for a server listening on ``bound`` (see the module docstring), plus
        ``extra``."""
        return cls([*default_hosts(bound), *extra])

    def allows(self, host_header: str) -> bool:
        return self.any or host_name(host_header) in self.names

    def allows_origin(self, origin: str, host_header: str = "", scheme: str = "http") -> bool:
        """An ``Origin`` header (``scheme://host[:port]``; ``null`` from sandboxed pages): an
        allowed host, on the scheme and port of the request (``host_header`` and ``scheme``)."""
        if self.any:
            return True
        try:
            parts = urlsplit(origin.strip())
            port = parts.port
        except ValueError:  # a port that is not a number
            return False
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.hostname is None:
            return False
        if host_name(parts.netloc) not in self.names:
            return False
        own = _origin(scheme, host_header)  # another allowed name of it, on its scheme and port
        return own is not None and (parts.scheme, port or DEFAULT_PORTS[parts.scheme]) == (
            own[0],
            own[2],
        )

    def describe(self) -> str:
        return ANY_HOST if self.any else ", ".join(sorted(self.names))


DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(scheme: str, host_header: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of the server as a request names it; None when its Host is odd."""
    scheme = "https" if scheme in ("https", "wss") else "http"
    try:
        parts = urlsplit(f"{scheme}://{host_header.strip()}")
        port = parts.port
    except ValueError:
        return None
    return scheme, host_name(parts.netloc), port or DEFAULT_PORTS[scheme]


def default_hosts(bound: str) -> list[str]:
    host = host_name(bound)
    if host in WILDCARD_ADDRESSES:
        return [*LOOPBACK_NAMES, *machine_names()]
    if is_loopback(host):
        return [*LOOPBACK_NAMES, host]
    return [host]


def machine_names() -> list[str]:
    """This machine's host names and the addresses they and its default route resolve to
    (no packet is sent: a UDP socket is only pointed at a documentation address)."""
    names = {socket.gethostname(), socket.getfqdn()}
    for name in list(names):
        with contextlib.suppress(OSError, UnicodeError):
            names |= {str(info[4][0]) for info in socket.getaddrinfo(name, None)}
    for family, probe in ((socket.AF_INET, "192.0.2.1"), (socket.AF_INET6, "2001:db8::1")):
        with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_DGRAM) as udp:
            udp.connect((probe, 9))
            names.add(udp.getsockname()[0])
    return sorted(name for name in names if name)


def is_loopback(host: str) -> bool:
    """Whether listening on (or being asked for) ``host`` concerns this machine only."""
    host = host_name(host) if host.startswith("[") else host.strip().lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
