"""The one exception type for bad input that a person can fix.

Every layer raises :class:`NearsightError` (or a subclass) for a problem with what it was
given: a missing file, a wrong dataset layout, an unreadable image, a model and gallery that do
not match. The CLI prints its message as a single line and exits with status 2. An ``OSError`` that
reaches the CLI (a full disk, a quota, no permission) is a fault of the machine and is
reported the same way; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Iterable


class NearsightError(Exception):
    """Bad input: the message is one line that names the problem and, where possible, the fix."""

    exit_code = 2


def closest_names(name: str, known: Iterable[str], most: int = 5) -> str:
    """The names among ``known`` closest to a mistyped ``name``, for a message: "did you mean
    'a', 'b'?", or the first few names when none is close, or "none" when there are none."""
    import difflib

    choices = sorted(set(known))
    if not choices:
        return "it has none"
    close = difflib.get_close_matches(name, choices, n=most, cutoff=0.5)
    if close:
        return "did you mean " + ", ".join(repr(c) for c in close) + "?"
    more = f" (of {len(choices)})" if len(choices) > most else ""
    return "its names include " + ", ".join(repr(c) for c in choices[:most]) + more


class Busy(NearsightError):
    """Work that did not finish in time because the machine is busy, not because of what was
    asked: the server answers 503 with Retry-After, never a 4xx."""


def printable(text: str, limit: int = 200) -> str:
    """``text`` made safe to quote inside a one-line message: control characters (a newline, a
    terminal escape) are written as their escapes, so a name from a file or a request cannot
    start a line of its own; at most ``limit`` characters."""
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[: limit + 1])
    return shown if len(text) <= limit else shown[:limit] + "..."
