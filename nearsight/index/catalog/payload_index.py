"""A gallery's payload index: its filterable columns as sorted arrays (the base, a file mapped
from the gallery folder: nearsight/index/catalog/payload_file.py), the columns of the items
added since (read from the catalog when the gallery opens: ids after the base's), and the ids
removed since. Filters are set operations on them (nearsight/index/catalog/column_filter.py,
with the SQL query's answers), with no connection and no SQL per search.

The shape every filter reads: a column maps each value to a set of item ids (a slice of
``ids`` ordered by value: a text value's ids, a range of numbers); the items without a value
are the ids that are not in ``has``. A value's ids are what an any-of filter unites and what a
facet count intersects with the ids a filter allows (:meth:`PayloadIndex.value_ids`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from nearsight.data.meta import MetaValue
from nearsight.index.catalog.column_filter import MASK_SHARE, Blocks
from nearsight.index.catalog.columns import Column, Snapshot, contains
from nearsight.index.catalog.filter_notes import MAX_VALUES, notes_on
from nearsight.index.catalog.filters import FILTERABLE_BUILTINS, Condition
from nearsight.index.catalog.payload_eval import Ranks, evaluate_ranked, part_rank

EMPTY = Column({})


class PayloadIndex:
    """The columns of ``base`` (items up to its last id; ``removed``: those of them gone since)
    and of ``added`` (the items after it, or None)."""

    def __init__(self, base: Snapshot, added: Snapshot | None, removed: np.ndarray):
        self.base = base
        self.added = added if added is not None and len(added.all_ids) else None
        self.removed = np.asarray(removed, np.int64)
        keys = set(base.columns) | (set(self.added.columns) if self.added else set())
        self._parts = [snap for snap in (self.base, self.added) if snap is not None]
        for snapshot in self._parts:  # a key only one side has: no item of the other has it
            for key in keys - set(snapshot.columns):
                snapshot.columns[key] = EMPTY
        self.keys = sorted(keys)
        self._made: dict[tuple[int, str, str], np.ndarray] = {}  # ranks not in the file

    def snapshots(self) -> list[Snapshot]:
        """The base's columns, then the added items' (when any)."""
        return list(self._parts)

    def meta_keys(self) -> list[str]:
        """The metadata columns (not the built-in ones) some item has a value for."""
        return [key for key in self.keys if key not in FILTERABLE_BUILTINS and self.holds_any(key)]

    def holds_any(self, key: str) -> bool:
        """Whether some live item has a value for ``key``."""
        return any(self._live(snapshot, snapshot.columns[key].has) for snapshot in self._parts)

    def _live(self, snapshot: Snapshot, ids: np.ndarray) -> bool:
        """Whether any of ``ids`` (of ``snapshot``) is a live item's."""
        if snapshot is not self.base or not len(self.removed) or not len(ids):
            return bool(len(ids))
        return not contains(self.removed, ids).all()

    def column_types(self) -> dict[str, str]:
        """Each metadata column's type as its stored values are: ``str`` when any is text,
        ``float`` when any is a real, else ``int`` (Catalog.column_types' rule)."""
        out = {}
        for key in self.meta_keys():
            kinds = {storage for snapshot in self._parts
                     for storage, part in snapshot.columns[key].parts.items()
                     if self._live(snapshot, part.ids)}  # fmt: skip
            out[key] = "str" if "text" in kinds else "float" if "real" in kinds else "int"
        return out

    def filter_ids(self, typed: Sequence[Condition], check: Callable[[], None]) -> np.ndarray:
        """Sorted int64 ids of the live items meeting every condition (typed by their
        columns, column_filter.supported); ``check`` raises past the time budget.

        An any-of ``KEY=A|B`` is the union of its values' sets, intersected with what the
        other conditions allow; ``KEY!=A|B`` takes that union away (every condition on a tag
        column is one of these: nearsight/index/catalog/list_columns.py)."""
        plain = [c for c in typed if not isinstance(c.value, tuple)]
        any_of = sorted((c for c in typed if isinstance(c.value, tuple)), key=lambda c: c.op != "=")
        found = self._plain_ids(plain, check) if plain else None
        low, span = self._span()
        for condition in any_of:  # "!=" after "=": a set to take from first
            if found is not None and not len(found):
                break
            # the values' sets (a tag column's may overlap): a bitmap over the ids when large
            union = Blocks([self._plain_ids([Condition(condition.key, "=", v)], check)
                            for v in condition.values])  # fmt: skip
            if condition.op == "=" and found is None:  # several sorted sets: a bitmap's order
                found = (np.flatnonzero(union.mask(low, span)) + low if union.size * MASK_SHARE
                         > span else union.sorted_ids(low, span))  # fmt: skip
            elif condition.op == "=" and found is not None:
                found = found[union.holds(found, low, span)]
            else:
                found = self.live_ids() if found is None else found
                found = found[~union.holds(found, low, span)]
            check()
        return self.live_ids() if found is None else found

    def _span(self) -> tuple[int, int]:
        """(the first id, the id span) of the base and the added items together."""
        firsts = [int(s.all_ids[0]) for s in self._parts if len(s.all_ids)]
        lasts = [int(s.all_ids[-1]) for s in self._parts if len(s.all_ids)]
        return (min(firsts), max(lasts) - min(firsts) + 1) if firsts else (0, 0)

    def live_ids(self) -> np.ndarray:
        """Sorted int64 ids of every live item."""
        found = np.asarray(self.base.all_ids, np.int64)
        if len(self.removed) and len(found):
            found = found[~contains(self.removed, found)]
        if self.added is not None:
            found = np.concatenate([found, np.asarray(self.added.all_ids, np.int64)])
        return found

    def _plain_ids(self, typed: Sequence[Condition], check: Callable[[], None]) -> np.ndarray:
        """:meth:`filter_ids` of conditions with one value each."""
        found = evaluate_ranked(typed, self.base, self._ranks(self.base), check)
        if len(self.removed) and len(found):
            found = found[~contains(self.removed, found)]
        if self.added is not None:  # its ids all follow the base's: the order holds
            more = evaluate_ranked(typed, self.added, self._ranks(self.added), check)
            found = np.concatenate([found, more])
        return found

    def _ranks(self, snapshot: Snapshot) -> Ranks:
        """(key, storage) -> the part's rank by id: stored in the file, else made once."""
        low = int(snapshot.all_ids[0]) if len(snapshot.all_ids) else 0
        span = int(snapshot.all_ids[-1]) - low + 1 if len(snapshot.all_ids) else 0

        def ranks(key: str, storage: str) -> np.ndarray:
            part = snapshot.columns[key].parts[storage]
            if part.rank is not None and len(part.rank) == span:
                return part.rank
            made = self._made.get((id(snapshot), key, storage))
            if made is None:  # a race makes it twice, the same
                made = self._made[(id(snapshot), key, storage)] = part_rank(part, low, span)
            return made

        return ranks

    def value_ids(self, key: str, value: MetaValue) -> np.ndarray:
        """The sorted ids of the live items whose ``key`` equals ``value``: one value's set."""
        return self.filter_ids([Condition(key, "=", value)], lambda: None)

    def text_values(self, key: str) -> list[str]:
        """The distinct text values of column ``key`` (at most MAX_VALUES), sorted."""
        found: set[str] = set()
        for snapshot in self._parts:
            part = snapshot.columns[key].parts.get("text")
            if part is not None and part.starts is not None:
                found.update(part.text().decoded()[:MAX_VALUES])
        return sorted(found)[:MAX_VALUES]

    def notes(self, typed: Sequence[Condition], column_types: dict[str, str]) -> list[str]:
        """filter_notes' notes on text values no item holds, from the arrays."""
        return notes_on(typed, column_types, lambda key, value: len(self.value_ids(key, value)) > 0,
                        self.text_values)  # fmt: skip

    def facets(
        self, allowed: np.ndarray | None, keys: Sequence[str]
    ) -> dict[str, dict[object, int]]:
        """Per column of ``keys``, each value's count among the ``allowed`` live ids (sorted;
        None: every live item): a value's ids intersected with the allowed ones, through the
        candidates' ranks. Text and integer values; a column's other values are not counted."""
        out: dict[str, dict[object, int]] = {key: {} for key in keys}
        for snapshot in self._parts:
            ids = self._live_ids(snapshot) if allowed is None else self._within(snapshot, allowed)
            if not len(ids):
                continue
            at = ids - int(snapshot.all_ids[0])
            ranks = self._ranks(snapshot)
            for key in keys:
                counts = out[key]
                for storage, part in snapshot.columns[key].parts.items():
                    if storage == "real" or not len(part.ids):
                        continue
                    rank = np.asarray(ranks(key, storage)[at])
                    rank = rank[rank >= 0]
                    if storage == "text":
                        starts = np.asarray(part.starts)
                        held = np.bincount(np.searchsorted(starts, rank, side="right") - 1,
                                           minlength=len(starts) - 1)  # fmt: skip
                        named = [(part.values[int(i)].decode("utf-8", "surrogatepass"), held[i])
                                 for i in np.flatnonzero(held)]  # fmt: skip
                    else:
                        values, held = np.unique(np.asarray(part.values)[rank], return_counts=True)
                        named = list(zip(values.tolist(), held, strict=True))
                    for value, count in named:
                        counts[value] = counts.get(value, 0) + int(count)
        return out

    def _live_ids(self, snapshot: Snapshot) -> np.ndarray:
        ids = np.asarray(snapshot.all_ids, np.int64)
        if snapshot is self.base and len(self.removed):
            ids = ids[~contains(self.removed, ids)]
        return ids

    @staticmethod
    def _within(snapshot: Snapshot, allowed: np.ndarray) -> np.ndarray:
        """The ids of ``allowed`` (sorted) in ``snapshot``'s id range."""
        if not len(snapshot.all_ids):
            return allowed[:0]
        low, high = int(snapshot.all_ids[0]), int(snapshot.all_ids[-1])
        start, stop = np.searchsorted(allowed, [low, high + 1])
        return np.asarray(allowed[start:stop], np.int64)
