"""Bounded pools of one kind of work, for the REST API."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi.concurrency import run_in_threadpool


class GateFull(Exception):
    """The gate's queue is full: the server answers 503 with Retry-After."""


class WorkGate:
    """At most ``concurrency`` pieces of one kind of work at once (a decoded 64 MP image is
    ~200 MB; a re-ranking or a filter keeps a core busy), and at most ``max_waiting`` requests
    waiting for one; past that, :class:`GateFull`. Waiting holds no thread."""

    def __init__(self, concurrency: int, max_waiting: int, what: str = "requests"):
        self.concurrency = max(1, concurrency)
        self.max_waiting = max_waiting
        self.what = what
        self._semaphore: asyncio.Semaphore | None = None  # made in the server's event loop
        self.waiting = 0

    async def run(self, work: Callable[[], Any]) -> Any:
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.concurrency)
        if self.waiting >= self.max_waiting:
            raise GateFull(f"the server is busy ({self.waiting} {self.what} waiting): retry")
        self.waiting += 1
        try:
            async with self._semaphore:
                return await run_in_threadpool(work)
        finally:
            self.waiting -= 1
