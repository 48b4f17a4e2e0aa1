"""Micro-batching: concurrent requests share one embedding call.

Each request preprocesses its own image (decoding and resizing run in the request's thread, in
parallel) and hands the model input to :meth:`EmbedBatcher.submit`. One worker thread takes
whatever inputs are waiting, up to ``max_batch``, and embeds them in one call. Nothing waits
for a batch to fill: a lone request is embedded at once (no added latency at one client), and
requests that arrive while the model is busy are embedded together in the next call, so the
model's per-call overhead is shared and throughput grows with load.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

DEFAULT_MAX_BATCH = 16
DEFAULT_MAX_WAITING = 256  # inputs queued for the model before new ones are refused


class BatcherFull(RuntimeError):
    """The batcher already holds ``max_waiting`` inputs: the caller should retry later."""


class EmbedBatcher:
    """Embeds submitted model inputs in batches on one worker thread; ``embed`` maps a stacked
    batch [B, 3, S, S] to embeddings [B, D]."""

    def __init__(
        self,
        embed: Callable[[Any], np.ndarray],
        max_batch: int = DEFAULT_MAX_BATCH,
        max_waiting: int = DEFAULT_MAX_WAITING,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self._embed = embed
        self.max_batch = max_batch
        self.max_waiting = max_waiting
        self._queue: queue.SimpleQueue[tuple[Any, Future] | None] = queue.SimpleQueue()
        self._closed = False
        self.calls = 0  # embedding calls made (the tests and the bench read these)
        self.embedded = 0
        self._thread = threading.Thread(target=self._work, name="nearsight-embed", daemon=True)
        self._thread.start()

    def submit(self, model_input: Any) -> Future:
        """A future of the input's embedding [D] (float32); raises if the batcher is closed, and
        :class:`BatcherFull` when ``max_waiting`` inputs are queued already."""
        if self._closed:
            raise RuntimeError("the embedding batcher is closed")
        if self._queue.qsize() >= self.max_waiting:
            raise BatcherFull(f"{self.max_waiting} images are already waiting for the model")
        future: Future = Future()
        self._queue.put((model_input, future))
        return future

    @property
    def waiting(self) -> int:
        """Inputs queued for the model now."""
        return self._queue.qsize()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._thread.join(timeout=30)

    def _work(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            stop = False
            while len(batch) < self.max_batch:
                try:
                    waiting = self._queue.get_nowait()
                except queue.Empty:
                    break
                if waiting is None:
                    stop = True
                    break
                batch.append(waiting)
            self._run(batch)
            if stop:
                return

    def _run(self, batch: list[tuple[Any, Future]]) -> None:
        live = [(x, f) for x, f in batch if f.set_running_or_notify_cancel()]
        if not live:
            return
        try:
            inputs = np.stack([x for x, _ in live])
            vectors = np.asarray(self._embed(inputs), dtype=np.float32)
        except BaseException as error:  # every waiting request hears of it, none hangs
            for _, future in live:
                future.set_exception(error)
            return
        self.calls += 1
        self.embedded += len(live)
        for (_, future), vector in zip(live, vectors, strict=True):
            future.set_result(vector)
