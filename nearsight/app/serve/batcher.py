"""Micro-batching: concurrent requests share one embedding call.

Each request preprocesses its own image (decoding and resizing run in the request's thread, in
parallel) and hands the model input to :meth:`EmbedBatcher.submit`. One worker thread takes
whatever inputs are waiting, up to ``max_batch``, and embeds them in one call. Nothing waits
for a batch to fill: a lone request is embedded at once (no added latency at one client), and
requests that arrive while the model is busy are embedded together in the next call, so the
model's per-call overhead is shared and throughput grows with load.

A request that finds the model idle and nobody waiting embeds in its own thread instead
(:meth:`EmbedBatcher.embed_now`): the trip to the worker thread and back to the caller is the
largest fixed cost of a lone search after the model itself, and there is nothing to batch it
with. One lock keeps the model to one call at a time either way.
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
        self._model = threading.Lock()  # one embedding call at a time, batched or not
        self._batching = False  # the worker holds a batch: embed_now gives way to it
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

    def embed_now(self, model_input: Any) -> np.ndarray | None:
        """The input's embedding [D] (float32), computed in the calling thread when the model
        is idle and no input waits for it; None otherwise (then :meth:`submit` it)."""
        if self._closed or self._waiting_for_model() or not self._model.acquire(blocking=False):
            return None
        try:
            if self._waiting_for_model():  # one arrived meanwhile: it goes first
                return None
            vectors = np.asarray(self._embed(np.stack([model_input])), dtype=np.float32)
            self.calls += 1
            self.embedded += 1
            return vectors[0]
        finally:
            self._model.release()

    def _waiting_for_model(self) -> bool:
        return self._batching or self._queue.qsize() > 0

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
            self._batching = True
            try:
                with self._model:  # the batch is what waits once the model is free
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
            finally:
                self._batching = False
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
