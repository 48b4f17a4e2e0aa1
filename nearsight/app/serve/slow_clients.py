"""Every connection within a time budget, and no client holding most of them (slowloris).

uvicorn closes a kept-alive connection that stays idle, but any byte cancels that timer, and
it has no limit on how long a request's headers may take, on how long an answer may take to
drain, or on how many requests a connection may send ahead of their answers. The server runs
uvicorn with :class:`PolicedH11Protocol` as its HTTP protocol (uvicorn's public ``http``
setting: a subclass, nothing of uvicorn's changed for the process), so that on every
connection:

- each request's headers, the first and every later one on a kept-alive connection, must all
  arrive within ``header_timeout_s`` of their first byte (of the connection's opening, for
  the first request), or the connection is closed;
- between requests, a connection idle for ``keep_alive_s`` is closed (uvicorn's own timer);
- an answer whose bytes the client does not take (the server's write buffer stays full) for
  ``write_timeout_s`` has its connection closed;
- at most ``max_pipelined`` requests follow each other from what a connection sent ahead of
  their answers (HTTP pipelining); the next closes the connection;
- at most ``max_waiting`` connections wait at once: opened or kept alive but not in the middle of
  a request (nobody knows yet whether they hold the key). Past that, the one waiting longest
  is closed: a client that sends its request when it connects is never the oldest, so a crowd
  of slow connections from many addresses cannot fill ``--max-connections``;
- one client holds at most ``max_per_client`` connections at once: the next one is answered
  429 and closed at once, so that one client cannot take the whole ``--max-connections`` (a
  trusted proxy's connections count only towards the whole). A client is its socket's
  address's network (nearsight/app/serve/clients.py: network_of, /24 or /64).

The settings of a server are a :class:`ConnectionPolicy` on its :class:`PolicedConfig`; a
request's body is bounded by the guard (nearsight/app/serve/guard.py).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from nearsight.app.serve.clients import network_of

DEFAULT_HEADER_TIMEOUT_S = 10.0
KEEP_ALIVE_S = 5.0
DEFAULT_MAX_PER_CLIENT = 32
DEFAULT_WRITE_TIMEOUT_S = 30.0
DEFAULT_MAX_PIPELINED = 8
RETRY_AFTER_S = 5


@dataclass
class ConnectionPolicy:
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    keep_alive_s: float = KEEP_ALIVE_S
    max_per_client: int = DEFAULT_MAX_PER_CLIENT
    write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S
    max_pipelined: int = DEFAULT_MAX_PIPELINED
    # open connections per client; touched only on the server's event loop
    open_by_client: collections.Counter[str] = field(default_factory=collections.Counter)
    refused: int = 0  # connections answered 429 for being over max_per_client
    max_waiting: int = 0  # 0: no cap
    # connections between requests, the longest waiting first (touched only on the event loop)
    waiting: collections.OrderedDict[Any, None] = field(default_factory=collections.OrderedDict)
    evicted: int = 0  # waiting connections closed to make room
    stalled: int = 0  # connections closed because their answer did not drain in time
    pipelined: int = 0  # connections closed for sending too many requests ahead
    # whether an address is a trusted proxy's (its connections are many clients')
    is_proxy: Callable[[str], bool] = lambda address: False


class PolicedConfig(uvicorn.Config):
    """uvicorn's Config with the :class:`ConnectionPolicy` its connections follow."""

    def __init__(self, app: Any, *, policy: ConnectionPolicy, **options: Any):
        # uvicorn annotates timeout_keep_alive as int but only hands it to loop.call_later,
        # which takes a float delay: a stub too narrow, so a fractional keep-alive is passed
        keep_alive: int = policy.keep_alive_s  # type: ignore[assignment]
        super().__init__(
            app,
            http=PolicedH11Protocol,
            proxy_headers=False,
            timeout_keep_alive=keep_alive,
            **options,
        )
        self.policy = policy


class PolicedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol under a :class:`ConnectionPolicy` (the module docstring)."""

    # uvicorn's H11Protocol narrows asyncio's BaseTransport to Transport (ignored there too)
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        policy: ConnectionPolicy = getattr(self.config, "policy", None) or ConnectionPolicy()
        self.policy = policy
        self.peer = self.client[0] if self.client else ""
        self.identity = network_of(self.peer)
        self.seen: Any = None  # the request whose headers were last seen complete
        self.timer: asyncio.TimerHandle | None = None
        self.write_timer: asyncio.TimerHandle | None = None
        self.ahead = 0  # requests in a row that came from what was sent ahead of answers
        self.counted = self.refused = self.completing = False
        if not policy.is_proxy(self.peer):
            if policy.open_by_client[self.identity] >= policy.max_per_client:
                self.refused = True
                policy.refused += 1
                _refuse(transport, policy)
                return
            policy.open_by_client[self.identity] += 1
            self.counted = True
        self._arm()
        self._wait()

    def connection_lost(self, exc: Exception | None) -> None:
        self._release()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return  # answered 429 and closing: nothing it sends is read
        idle = self.cycle is None or self.cycle.response_complete
        super().data_received(data)  # uvicorn cancels its idle keep-alive timer on any byte
        if self.transport.get_protocol() is not self:  # upgraded to a WebSocket
            self._release()
            return
        cycle = self.cycle
        if cycle is not None and cycle is not self.seen:  # a request's headers are in
            self.seen = cycle
            if idle:
                self.ahead = 0
            self._cancel()
            self._unwait()
        if self.timer is None and (cycle is None or cycle.response_complete):
            self._arm()  # bytes of the next request (after pipelined ones): its headers are timed

    def on_response_complete(self) -> None:
        before = self.cycle
        super().on_response_complete()  # may start a pipelined request at once
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and cycle is not before and not cycle.response_complete:
            self.seen = cycle  # a pipelined request whose headers were in already
            self.ahead += 1
            if self.ahead > self.policy.max_pipelined:
                self.policy.pipelined += 1
                _reset(self.transport)
        else:
            self._wait()

    def pause_writing(self) -> None:
        super().pause_writing()
        seconds = self.policy.write_timeout_s
        if self.write_timer is None and seconds > 0:
            self.write_timer = self.loop.call_later(seconds, self._stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.write_timer is not None:
            self.write_timer.cancel()
            self.write_timer = None

    # -- the policy's bookkeeping ------------------------------------------------------------

    def _stalled(self) -> None:
        self.write_timer = None
        self.policy.stalled += 1
        _reset(self.transport)

    def _wait(self) -> None:
        """This connection waits between requests; past ``max_waiting``, the longest waiting
        closes."""
        policy = self.policy
        policy.waiting[self] = None
        policy.waiting.move_to_end(self)
        while policy.max_waiting and len(policy.waiting) > policy.max_waiting:
            oldest, _ = policy.waiting.popitem(last=False)
            policy.evicted += 1
            if not oldest.transport.is_closing():
                oldest.transport.close()

    def _unwait(self) -> None:
        self.policy.waiting.pop(self, None)

    def _arm(self) -> None:
        seconds = self.policy.header_timeout_s
        if seconds and seconds > 0:
            self.timer = self.loop.call_later(seconds, self._close_if_waiting)

    def _cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _release(self) -> None:
        if getattr(self, "policy", None) is None:
            return
        self._cancel()
        self._unwait()
        if self.write_timer is not None:
            self.write_timer.cancel()
            self.write_timer = None
        if self.counted:
            self.counted = False
            counts = self.policy.open_by_client
            counts[self.identity] -= 1
            if counts[self.identity] <= 0:
                del counts[self.identity]

    def _close_if_waiting(self) -> None:
        self.timer = None
        cycle = self.cycle
        waiting = cycle is None or (cycle is self.seen and cycle.response_complete)
        if waiting and not self.transport.is_closing():
            self.transport.close()


def _reset(transport: asyncio.Transport) -> None:
    """Close at once with a reset: close() would wait for a client that reads nothing, and
    even abort() leaves the kernel holding the unsent answer for it (SO_LINGER 0 drops it)."""
    sock = transport.get_extra_info("socket")
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def _refuse(transport: asyncio.Transport, policy: ConnectionPolicy) -> None:
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
