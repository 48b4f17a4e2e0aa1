"""Reads and writes on a non-blocking pipe that end at a deadline, whatever the other end does:
a decode worker that stops reading or answering costs its caller the deadline, no more."""

from __future__ import annotations

import os
import select
import time


class Late(Exception):
    """The deadline passed before the whole transfer."""


def send_by(fd: int, data: bytes, deadline: float) -> None:
    """All of ``data`` written to the non-blocking ``fd`` by ``deadline`` (time.monotonic()),
    else :class:`Late`."""
    view = memoryview(data)
    while view:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Late
        _, writable, _ = select.select([], [fd], [], left)
        if writable:
            try:
                view = view[os.write(fd, view[: 1 << 16]) :]
            except BlockingIOError:
                continue


def receive_by(fd: int, count: int, deadline: float) -> bytes:
    """Exactly ``count`` bytes read from the non-blocking ``fd`` by ``deadline``, else
    :class:`Late` (EOFError when the writer closes first)."""
    chunks, left = [], count
    while left:
        wait = deadline - time.monotonic()
        if wait <= 0:
            raise Late
        readable, _, _ = select.select([fd], [], [], wait)
        if not readable:
            continue
        try:
            chunk = os.read(fd, min(left, 1 << 20))
        except BlockingIOError:
            continue
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
