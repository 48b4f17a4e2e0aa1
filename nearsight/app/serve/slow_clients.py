"""Every connection within a time budget, and no client holding most of them (slowloris).

uvicorn (under Gradio) closes a kept-alive connection that stays idle, but any byte cancels
that timer, and it has no limit on how long a request's headers may take: a client that
sends them a byte at a time holds its connection for as long as it likes, and 256 such
connections make every other client get 503. :func:`install` wraps uvicorn's HTTP protocol
classes once per process so that, on every connection:

- each request's headers, the first and every later one on a kept-alive connection, must all
  arrive within ``header_timeout_s`` of their first byte (of the connection's opening, for
  the first request), or the connection is closed;
- between requests, a connection idle for ``keep_alive_s`` is closed (uvicorn's own timer);
- at most ``max_waiting`` connections wait at once: opened or kept alive but not in the middle of
  a request (nobody knows yet whether they hold the key). Past that, the one waiting longest
  is closed: a client that sends its request when it connects is never the oldest, so a crowd
  of slow connections from many addresses cannot fill ``--max-connections``;
- one client address holds at most ``max_per_client`` connections at once: the next one is
  answered 429 and closed at once, so that one address cannot take the whole
  ``--max-connections`` (a trusted proxy's connections count only towards the whole);
- a client is its socket's address: uvicorn's own ``X-Forwarded-For`` handling is taken off
  before the first request (nearsight/app/serve/clients.py).

The settings of a server are a :class:`ConnectionPolicy` set on its uvicorn config (each
connection reads them when it opens); a request's body is bounded by the guard
(nearsight/app/serve/guard.py).
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nearsight.app.serve.clients import without_uvicorn_proxy_headers

DEFAULT_HEADER_TIMEOUT_S = 10.0
KEEP_ALIVE_S = 5.0
DEFAULT_MAX_PER_CLIENT = 32
RETRY_AFTER_S = 5
POLICY_ATTRIBUTE = "nearsight_connections"


@dataclass
class ConnectionPolicy:
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    keep_alive_s: float = KEEP_ALIVE_S
    max_per_client: int = DEFAULT_MAX_PER_CLIENT
    # open connections per client address; touched only on the server's event loop
    open_by_client: collections.Counter[str] = field(default_factory=collections.Counter)
    refused: int = 0  # connections answered 429 for being over max_per_client
    max_waiting: int = 0  # 0: no cap
    # connections between requests, the longest waiting first (touched only on the event loop)
    waiting: collections.OrderedDict[Any, None] = field(default_factory=collections.OrderedDict)
    evicted: int = 0  # waiting connections closed to make room
    # whether an address is a trusted proxy's (its connections are many clients')
    is_proxy: Callable[[str], bool] = lambda address: False

    def attach(self, config: Any) -> None:
        """Make this the policy of the uvicorn server whose config is ``config``."""
        setattr(config, POLICY_ATTRIBUTE, self)


# the policy of connections opened before a server's own is attached (launch_app sets it first)
_PENDING = {"policy": ConnectionPolicy()}


def install(policy: ConnectionPolicy) -> None:
    """Wrap uvicorn's protocols (once per process); ``policy`` covers the connections of a
    server whose config has no policy yet (attach it as soon as the server exists)."""
    _PENDING["policy"] = policy
    for protocol in _protocol_classes():
        if getattr(protocol, "_nearsight_wrapped", False):
            continue
        protocol.connection_made = _connection_made(protocol.connection_made)
        protocol.connection_lost = _connection_lost(protocol.connection_lost)
        protocol.data_received = _data_received(protocol.data_received)
        protocol.on_response_complete = _response_complete(protocol.on_response_complete)
        protocol._nearsight_wrapped = True


def _protocol_classes() -> list[type]:
    from uvicorn.protocols.http.h11_impl import H11Protocol

    classes: list[type] = [H11Protocol]
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools is optional
        pass
    else:
        classes.append(HttpToolsProtocol)
    return classes


def _connection_made(original):
    def connection_made(self, transport) -> None:
        original(self, transport)
        if self.config.proxy_headers:  # before the first request (the config is shared)
            without_uvicorn_proxy_headers(self.config)
        self.app = self.config.loaded_app
        policy = getattr(self.config, POLICY_ATTRIBUTE, None) or _PENDING["policy"]
        self._ns_policy = policy
        self._ns_client = self.client[0] if self.client else ""
        self._ns_seen = None  # the request whose headers were last seen complete
        self._ns_timer = None
        self.timeout_keep_alive = policy.keep_alive_s
        self._ns_counted = self._ns_refused = False
        if policy.is_proxy(self._ns_client):
            _arm(self)
            _wait(self)
            return
        if policy.open_by_client[self._ns_client] >= policy.max_per_client:
            self._ns_refused = True
            policy.refused += 1
            _refuse(transport, policy)
            return
        policy.open_by_client[self._ns_client] += 1
        self._ns_counted = True
        _arm(self)
        _wait(self)

    return connection_made


def _connection_lost(original):
    def connection_lost(self, exc) -> None:
        _release(self)
        original(self, exc)

    return connection_lost


def _data_received(original):
    def data_received(self, data: bytes) -> None:
        if getattr(self, "_ns_refused", False):
            return  # answered 429 and closing: nothing it sends is read
        original(self, data)  # uvicorn cancels its idle keep-alive timer on any byte
        if getattr(self, "_ns_policy", None) is None:
            return
        if self.transport.get_protocol() is not self:  # upgraded to a WebSocket
            _release(self)
            return
        cycle = getattr(self, "cycle", None)
        if cycle is not None and cycle is not self._ns_seen:  # a request's headers are in
            self._ns_seen = cycle
            _cancel(self)
            _unwait(self)
        if self._ns_timer is None and (cycle is None or cycle.response_complete):
            _arm(self)  # bytes of the next request (after pipelined ones): its headers are timed

    return data_received


def _response_complete(original):
    def on_response_complete(self) -> None:
        original(self)  # may start a pipelined request at once
        if getattr(self, "_ns_policy", None) is None or self.transport.is_closing():
            return
        cycle = getattr(self, "cycle", None)
        if cycle is not None and cycle is not self._ns_seen and not cycle.response_complete:
            self._ns_seen = cycle  # a pipelined request whose headers were in already
        else:
            _wait(self)

    return on_response_complete


def _wait(protocol) -> None:
    """``protocol`` waits between requests; past ``max_waiting``, the longest waiting closes."""
    policy = protocol._ns_policy
    policy.waiting[protocol] = None
    policy.waiting.move_to_end(protocol)
    while policy.max_waiting and len(policy.waiting) > policy.max_waiting:
        oldest, _ = policy.waiting.popitem(last=False)
        policy.evicted += 1
        if not oldest.transport.is_closing():
            oldest.transport.close()


def _unwait(protocol) -> None:
    policy = getattr(protocol, "_ns_policy", None)
    if policy is not None:
        policy.waiting.pop(protocol, None)


def _arm(protocol) -> None:
    seconds = protocol._ns_policy.header_timeout_s
    if seconds and seconds > 0:
        protocol._ns_timer = protocol.loop.call_later(seconds, _close_if_waiting, protocol)


def _cancel(protocol) -> None:
    timer = getattr(protocol, "_ns_timer", None)
    if timer is not None:
        timer.cancel()
        protocol._ns_timer = None


def _release(protocol) -> None:
    _cancel(protocol)
    _unwait(protocol)
    if getattr(protocol, "_ns_counted", False):
        protocol._ns_counted = False
        counts = protocol._ns_policy.open_by_client
        counts[protocol._ns_client] -= 1
        if counts[protocol._ns_client] <= 0:
            del counts[protocol._ns_client]


def _close_if_waiting(protocol) -> None:
    protocol._ns_timer = None
    cycle = getattr(protocol, "cycle", None)
    waiting = cycle is None or (cycle is protocol._ns_seen and cycle.response_complete)
    if waiting and not protocol.transport.is_closing():
        protocol.transport.close()


def _refuse(transport, policy: ConnectionPolicy) -> None:
    body = json.dumps({
        "error": f"too many open connections from your address (the limit is "
        f"{policy.max_per_client}): close some and retry"
    }).encode()  # fmt: skip
    head = (
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n"
        f"retry-after: {RETRY_AFTER_S}\r\nconnection: close\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    transport.write(head.encode() + body)
    transport.close()
