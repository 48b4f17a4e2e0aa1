"""Reads and writes on a non-blocking pipe that end at a deadline, whatever the other end does:
a decode worker that stops reading or answering costs its caller the deadline, no more."""

from __future__ import annotations

import os
import select
import time
from collections.abc import Sequence

MAX_CHUNK = 1 << 20  # the most one read asks for (the box sets its pipes to this size)


class Late(Exception):
    """The deadline passed before the whole transfer."""


def send_by(fd: int, data: bytes | Sequence[bytes], deadline: float) -> None:
    """All of ``data`` (bytes, or several buffers sent back to back) written to the
    non-blocking ``fd`` by ``deadline`` (time.monotonic()), else :class:`Late`. Each write
    takes as much as the pipe has room for (the buffers in one ``writev``, not copied into
    one): the reader wakes once for a message the pipe holds whole, not once per piece."""
    parts = [data] if isinstance(data, (bytes, bytearray, memoryview)) else list(data)
    views: list[memoryview] = [view for view in (memoryview(part) for part in parts) if view.nbytes]
    while views:
        if deadline - time.monotonic() <= 0:
            raise Late
        try:
            written = os.writev(fd, views)
        except BlockingIOError:  # the pipe is full: wait for room, at most until the deadline
            select.select([], [fd], [], max(0.0, deadline - time.monotonic()))
            continue
        advance(views, written)


def advance(views: list[memoryview], written: int) -> None:
    """Drop the first ``written`` bytes of ``views`` (what a ``writev`` took)."""
    while written:
        if written >= views[0].nbytes:
            written -= views.pop(0).nbytes
        else:
            views[0], written = views[0][written:], 0


def receive_by(fd: int, count: int, deadline: float) -> bytes:
    """Exactly ``count`` bytes read from the non-blocking ``fd`` by ``deadline``, else
    :class:`Late` (EOFError when the writer closes first)."""
    chunks, left = [], count
    while left:
        if deadline - time.monotonic() <= 0:
            raise Late
        try:
            chunk = os.read(fd, min(left, MAX_CHUNK))
        except BlockingIOError:  # nothing yet: wait for it, at most until the deadline
            select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            continue
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
