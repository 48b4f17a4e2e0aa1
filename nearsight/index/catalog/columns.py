"""The catalog's filterable columns as arrays, so that a filter is a few binary searches and
set operations (nearsight/index/catalog/column_filter.py) instead of an SQL query whose every
matching row becomes a Python object.

A column (a metadata key of ``item_meta``, or a built-in column of ``items``) is kept as one
:class:`Part` per SQLite storage class of its values (integer, real, text), each holding the
item ids ordered by value (ties by id) beside the sorted values: ``=`` is a block of that
order, a range a prefix or a suffix of it. Text values are one UTF-8 buffer with offsets
(compared as bytes, SQLite's BINARY collation), so a column of 10M items is a few arrays, not
10M Python objects.

Read from SQLite: nearsight/index/catalog/column_read.py; kept per version of the catalog
file: nearsight/index/catalog/column_cache.py; stored in the payload file:
nearsight/index/catalog/payload_file.py.
"""

from __future__ import annotations

import bisect
import operator
from dataclasses import dataclass
from typing import SupportsIndex

import numpy as np

# the built-in columns of ``items`` by declared type (their SQL affinity)
INTEGER_COLUMNS = ("id", "label", "width", "height")
TEXT_COLUMNS = ("class_name", "split")
STORAGE = ("integer", "real", "text")


class Unreadable(Exception):
    """A column the arrays would not answer as SQL does: filters on it stay in SQL."""


class TextValues:
    """Sorted distinct UTF-8 strings as one buffer and offsets; indexable (bytes) for bisect."""

    def __init__(self, encoded: list[bytes]):
        self.buffer: bytes | np.ndarray = b"".join(encoded)
        self.offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(one) for one in encoded], out=self.offsets[1:])

    @classmethod
    def from_arrays(cls, buffer: np.ndarray, offsets: np.ndarray) -> TextValues:
        """Values stored elsewhere (a payload file's mapped uint8 buffer and its offsets)."""
        values = cls([])
        values.buffer, values.offsets = buffer, offsets
        return values

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: SupportsIndex) -> bytes:
        at = operator.index(index)  # an int or a numpy integer
        return bytes(self.buffer[int(self.offsets[at]) : int(self.offsets[at + 1])])

    def decoded(self) -> list[str]:
        """Every value as text, in order."""
        return [self[i].decode("utf-8", "surrogatepass") for i in range(len(self))]


@dataclass(frozen=True)
class Part:
    """The values of one storage class: ``ids`` (int64) ordered by value; ``values`` the
    sorted values (int64, float64), or for text ``values`` the distinct strings and
    ``starts`` where each one's ids begin in ``ids`` (one more entry: len(ids))."""

    ids: np.ndarray
    values: np.ndarray | TextValues
    starts: np.ndarray | None = None
    rank: np.ndarray | None = None  # by id from the snapshot's first: position in ``ids``

    def text(self) -> TextValues:
        """A text part's distinct values, in order."""
        if not isinstance(self.values, TextValues):
            raise TypeError("a number part has no text values")
        return self.values

    def numbers(self) -> np.ndarray:
        """A number part's sorted values."""
        if isinstance(self.values, TextValues):
            raise TypeError("a text part has no numbers")
        return self.values


class Column:
    """One filterable column: its parts by storage class, and ``has``, the sorted ids having
    any value (found from the parts unless given)."""

    def __init__(self, parts: dict[str, Part], has: np.ndarray | None = None):
        self.parts = parts
        if has is None:  # a tag column lists an id under each of its tags: once each here
            ids = [np.zeros(0, np.int64), *(part.ids for part in parts.values())]
            has = np.unique(np.concatenate(ids))
        self.has: np.ndarray = has


@dataclass(frozen=True)
class Snapshot:
    """The columns read at one catalog version, and every item id (sorted)."""

    all_ids: np.ndarray
    has_meta_table: bool
    columns: dict[str, Column]


def contains(sorted_ids: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Boolean mask: which of ``ids`` are in ``sorted_ids`` (sorted, unique)."""
    if not len(sorted_ids):
        return np.zeros(len(ids), dtype=bool)
    position = np.minimum(np.searchsorted(sorted_ids, ids), len(sorted_ids) - 1)
    return sorted_ids[position] == ids


def text_bounds(part: Part, value: bytes) -> tuple[int, int]:
    """(how many ids have a text value < ``value``, how many <= it), bytewise order."""
    assert part.starts is not None  # a text part has its starts
    values = part.text()
    low = bisect.bisect_left(values, value)
    high = bisect.bisect_right(values, value, lo=low)
    return int(part.starts[low]), int(part.starts[high])
