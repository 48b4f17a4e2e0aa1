"""nearsight/core/arrays.py: np.load from threads at once, as concurrent gallery writers and
the server's reload do. Python 3.11's AST constructor (np.load parses each header with
ast.literal_eval) fails with SystemError when a thread switch lands inside a parse; the
switches are forced here: the shortest switch interval, and collections that run finalisers."""

from __future__ import annotations

import gc
import sys
import threading

import numpy as np

from nearsight.core.arrays import load_array, load_arrays


class _Cycle:
    """Garbage only the collector frees: its finaliser runs Python code mid-parse."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        for _ in range(200):
            pass


def _from_threads(work, threads: int = 4, rounds: int = 3000) -> list[BaseException]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for _ in range(rounds):
                work()
                [_Cycle() for _ in range(3)]
        except BaseException as error:  # surfaced below
            errors.append(error)

    interval, threshold = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(1e-6)
    gc.set_threshold(20, 2, 2)
    try:
        running = [threading.Thread(target=run) for _ in range(threads)]
        for thread in running:
            thread.start()
        for thread in running:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
        gc.set_threshold(*threshold)
    return errors


def test_npy_files_load_from_threads_at_once(tmp_path):
    path = tmp_path / "a.npy"
    np.save(path, np.arange(12, dtype=np.float32).reshape(3, 4))
    errors = _from_threads(lambda: load_array(path, mmap_mode="r", allow_pickle=False))
    assert errors == []
    assert load_array(path, mmap_mode="r").tolist() == np.arange(12).reshape(3, 4).tolist()


def test_npz_files_load_from_threads_at_once(tmp_path):
    path = tmp_path / "a.npz"
    np.savez(path, ids=np.arange(3), vectors=np.ones((3, 2), np.float32))
    errors = _from_threads(lambda: load_arrays(path, ("ids", "vectors")), rounds=1000)
    assert errors == []
    ids, vectors = load_arrays(path, ("ids", "vectors"))
    assert ids.tolist() == [0, 1, 2] and vectors.shape == (3, 2)
