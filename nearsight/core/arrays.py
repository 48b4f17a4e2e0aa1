"""NumPy's ``.npy`` / ``.npz`` reading, one thread at a time.

``np.load`` parses each array's header with ``ast.literal_eval``. Python 3.11's AST
constructor keeps its recursion count in state shared by every thread, so two threads parsing
at once can fail with ``SystemError: AST constructor recursion depth mismatch`` when a thread
switch lands inside one parse (reproduced on 3.11.7 with a garbage collection running a
finaliser; not on 3.12.1). Threads do open gallery files side by side (concurrent writers, the
server's reload beside its searches), so every ``np.load`` of the package goes through here.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

# np.unique imports numpy.ma lazily, and that import parses signatures with ast too: it is done
# once, here, rather than in a thread beside another thread's load
import numpy.ma  # noqa: F401

_READING = threading.Lock()


def load_array(path: str | os.PathLike[str], **options: Any) -> np.ndarray:
    """``np.load(path, **options)`` of one ``.npy`` file (with ``mmap_mode``, only its header
    is read here)."""
    with _READING:
        return np.load(path, **options)


def load_arrays(
    path: str | os.PathLike[str], names: Sequence[str], **options: Any
) -> tuple[np.ndarray, ...]:
    """The arrays ``names`` of one ``.npz`` file, read whole (a missing name: KeyError)."""
    with _READING, np.load(path, **options) as data:
        return tuple(data[name] for name in names)
