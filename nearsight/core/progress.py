"""Progress for long work: a tqdm bar on a terminal, plain lines otherwise (logs, CI, pipes)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")


def progress(
    iterable: Iterable[T],
    *,
    total: int | None = None,
    desc: str = "",
    unit: str = "it",
    every_s: float = 10.0,
) -> Iterator[T]:
    """Iterate ``iterable`` showing progress on stderr: a bar when stderr is a terminal, else a
    plain line at most every ``every_s`` seconds and one at the end."""
    if sys.stderr.isatty():
        yield from tqdm(iterable, total=total, desc=desc, unit=unit, dynamic_ncols=True)
        return
    start = last = time.perf_counter()
    done = 0
    for item in iterable:
        yield item
        done += 1
        now = time.perf_counter()
        if now - last >= every_s:
            last = now
            of = f"/{total}" if total is not None else ""
            print(
                f"{desc}: {done}{of} {unit} ({done / (now - start):.1f} {unit}/s)",
                file=sys.stderr,
                flush=True,
            )
    elapsed = time.perf_counter() - start
    print(f"{desc}: {done} {unit} in {elapsed:.1f}s", file=sys.stderr, flush=True)
