"""Bounded pools of one kind of work, shared fairly between clients, for the REST API."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from typing import Any

from fastapi.concurrency import run_in_threadpool

from nearsight.app.serve.clients import CURRENT_CLIENT

CLIENTS_REMEMBERED = 10_000  # when each client was last served, for the order of the next turns
# waiting places given to first requests, past max_waiting: each holds a connection, so the
# server's connection cap (--max-connections, 256 by default) bounds them first
MAX_FIRST_PLACES = 4096
REFUSAL_DELAY_S = 1.0  # a refused request from a client with work in flight is answered this late


class GateFull(Exception):
    """The gate's queue is full, or the client's share of it: 503 with Retry-After."""


class WorkGate:
    """At most ``concurrency`` pieces of one kind of work at once (a decoded 64 MP image is
    ~200 MB; a re-ranking or a filter keeps a core busy), and at most ``max_waiting`` requests
    waiting for one, ``per_client`` of them from one client; past that, :class:`GateFull`,
    except for a client with nothing in flight, whose one request may wait beyond
    ``max_waiting`` (each holds a connection: the server's connection cap bounds them).

    Fair shares: each identity (a named key's holder, else an address's network:
    nearsight/app/serve/clients.py) has its own queue, and a free slot goes first to a waiting
    identity with nothing running, then to the one served longest ago, so a flood waits
    behind its own requests: another client waits for at most the pieces already running
    and one turn of each other waiting client. Past ``max_waiting`` in all, a request from a
    client with something in flight already is refused (503 with Retry-After) before it
    costs anything, a second later (:meth:`_refuse`); a client with nothing in flight still
    gets its place (many identities cannot fill the gate against another). Waiting holds no
    thread."""

    def __init__(
        self,
        concurrency: int,
        max_waiting: int,
        what: str = "requests",
        per_client: int | None = None,
    ):
        self.concurrency = max(1, concurrency)
        self.max_waiting = max_waiting
        self.per_client = per_client if per_client is not None else max(1, max_waiting // 4)
        self.what = what
        self.refusal_delay_s = REFUSAL_DELAY_S
        self.running = 0
        self.waiting = 0
        # touched only on the server's event loop
        self._queues: dict[str, collections.deque[asyncio.Future[None]]] = {}
        self._served: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._running_by: collections.Counter[str] = collections.Counter()

    async def run(self, work: Callable[[], Any], client: str | None = None) -> Any:
        """``work()`` in a thread when this client's turn comes (``client``: the current
        request's, by default)."""
        client = CURRENT_CLIENT.get() if client is None else client
        if self.running < self.concurrency and not self.waiting:
            self._start(client)
        else:
            await self._wait_turn(client)
        try:
            return await run_in_threadpool(_as_client, client, work)
        finally:
            self._finish(client)

    async def _wait_turn(self, client: str) -> None:
        queue = self._queues.get(client)
        # an identity with nothing in flight always gets one place: a flood of many
        # identities fills max_waiting, and the next identity still waits its turn
        first = not queue and not self._running_by.get(client)
        bound = max(MAX_FIRST_PLACES, self.max_waiting) if first else self.max_waiting
        if self.waiting >= bound:
            await self._refuse(first, f"the server is busy ({self.waiting} {self.what} "
                                      "waiting): retry")  # fmt: skip
        queue = self._queues.setdefault(client, collections.deque())
        if len(queue) >= self.per_client:
            await self._refuse(
                False,
                f"{len(queue)} of your {self.what} are waiting already (the limit per client "
                f"is {self.per_client}): retry when they are answered",
            )
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.append(turn)
        self.waiting += 1
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # granted as it was cancelled: pass it on
                self._finish(client)
            else:
                self._forget(client, turn)
            raise

    async def _refuse(self, first: bool, message: str) -> None:
        """GateFull; after :attr:`refusal_delay_s` when the client has work in flight already:
        a flood that sends each refused request again at once is answered at the pace of
        that delay, not as fast as the server can refuse (a timer holds its connection, no
        thread, and its connections are capped)."""
        if not first and self.refusal_delay_s > 0:
            await asyncio.sleep(self.refusal_delay_s)
        raise GateFull(message)

    def _finish(self, client: str) -> None:
        self.running -= 1
        self._running_by[client] -= 1
        if self._running_by[client] <= 0:
            del self._running_by[client]
        self._grant()

    def _start(self, client: str) -> None:
        self.running += 1
        self._running_by[client] += 1
        self._served[client] = time.monotonic()
        self._served.move_to_end(client)
        while len(self._served) > CLIENTS_REMEMBERED:
            self._served.popitem(last=False)

    def _grant(self) -> None:
        """Give free slots to the waiting clients served longest ago, one turn each."""
        while self.running < self.concurrency and self._queues:
            client = min(self._queues, key=lambda name: (
                self._running_by[name] > 0, self._served.get(name, float("-inf"))))  # fmt: skip
            turn = self._queues[client][0]
            self._forget(client, turn)
            if not turn.done():
                self._start(client)
                turn.set_result(None)

    def _forget(self, client: str, turn: asyncio.Future[None]) -> None:
        queue = self._queues.get(client)
        if queue is None or turn not in queue:
            return
        queue.remove(turn)
        self.waiting -= 1
        if not queue:
            del self._queues[client]


def _as_client(client: str, work: Callable[[], Any]) -> Any:
    """``work()`` in a worker thread, for ``client`` (what the decode box charges: the page's
    events run outside the request that set CURRENT_CLIENT; the thread's context is a copy,
    so this ends with the work)."""
    CURRENT_CLIENT.set(client)
    return work()
