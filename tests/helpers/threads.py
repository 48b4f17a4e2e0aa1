"""A stand-in model that holds each call until the test lets it go (the batcher's tests)."""

from __future__ import annotations

import threading

import numpy as np


class HeldModel:
    """``embed(batch)`` doubles the batch, after recording its size and waiting for
    ``release`` (set once, it lets every later call through)."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.sizes: list[int] = []

    def embed(self, batch: np.ndarray) -> np.ndarray:
        self.sizes.append(len(batch))
        self.started.set()
        self.release.wait(10)
        return batch * 2.0
