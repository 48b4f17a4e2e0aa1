"""Filters evaluated on a payload index (nearsight/index/catalog/payload_index.py), cheapest first.

Each key's conditions become, per part of its column (a storage class: integer, real, text),
one span [start, stop) of the part's value order (column_filter._span: SQLite's rules, the
SQL query's answer), and the spans of its ``!=`` values. The key whose spans hold the fewest
ids gives the candidates (a text value's ids are one slice, already sorted); every other
condition is then tested on the candidates alone, by each candidate's position in the value
order of the part (``rank``, by id: -1 where the id has no value of that storage class), a
gather per key and no set of the size of the gallery. A filter of ``!=`` and ``KEY!=`` only
tests every item.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from nearsight.index.catalog.column_filter import LIST_SHARE, Blocks, _span
from nearsight.index.catalog.columns import Column, Part, Snapshot
from nearsight.index.catalog.filters import Condition

# (key, storage) -> the part's rank by id (position in its value order; -1: none)
Ranks = Callable[[str, str], np.ndarray]
UNSORTED_PENALTY = 2  # a range's ids come in value order: sorting them costs more than a slice


@dataclass
class KeyTest:
    """What the conditions on one key ask of an item."""

    key: str
    spans: dict[str, list[tuple[int, int]]] | None  # storage -> spans, its value in one (None: any)
    excluded: list[tuple[str, int, int]] = field(default_factory=list)  # spans of != values
    has_value: bool = False  # KEY!=
    no_value: bool = False  # KEY=

    def count(self, column: Column) -> int | None:
        """How many ids the spans hold (None: no span; a candidate set would be every item)."""
        if self.spans is not None:
            return sum(stop - start for spans in self.spans.values() for start, stop in spans)
        return len(column.has) if self.has_value else None


def key_tests(conditions: Sequence[Condition], snapshot: Snapshot) -> list[KeyTest]:
    by_key: dict[str, list[Condition]] = {}
    for condition in dict.fromkeys(conditions):
        by_key.setdefault(condition.key, []).append(condition)
    tests = []
    for key, on_key in by_key.items():
        parts = snapshot.columns[key].parts
        holds = [c for c in on_key if c.value is not None and c.op != "!="]
        test = KeyTest(key, None)
        if holds:
            test.spans = {}
            for storage, part in parts.items():
                spans = [(0, len(part.ids))]
                for condition in holds:  # each narrows the spans; an any-of unites its values
                    found = _merged([_span(part, storage, one) for one in condition.alternatives()])
                    spans = [(max(a, low), min(b, high)) for a, b in spans for low, high in found
                             if max(a, low) < min(b, high)]  # fmt: skip
                if spans:
                    test.spans[storage] = spans
        for condition in on_key:
            if condition.value is None:
                test.has_value |= condition.op == "!="
                test.no_value |= condition.op == "="
            elif condition.op == "!=":
                for one in condition.alternatives():
                    same = Condition(key, "=", one.value)
                    for storage, part in parts.items():
                        start, stop = _span(part, storage, same)
                        if start < stop:
                            test.excluded.append((storage, start, stop))
        tests.append(test)
    return tests


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``spans`` without repeats or overlaps (1 and 1.0 are one integer's span), in order."""
    out: list[tuple[int, int]] = []
    for start, stop in sorted(span for span in spans if span[0] < span[1]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], stop))
        else:
            out.append((start, stop))
    return out


def evaluate_ranked(
    conditions: Sequence[Condition],
    snapshot: Snapshot,
    ranks: Ranks,
    check: Callable[[], None],
) -> np.ndarray:
    """Sorted int64 ids of the snapshot's items meeting every condition (typed; supported
    by column_filter.supported); ``check`` raises past the time budget."""
    all_ids = snapshot.all_ids
    if not len(all_ids):
        return np.zeros(0, np.int64)
    low, span = int(all_ids[0]), int(all_ids[-1] - all_ids[0]) + 1
    tests = key_tests(conditions, snapshot)
    costs = []
    for test in tests:
        column = snapshot.columns[test.key]
        count = test.count(column)
        unsorted = test.spans is not None and any(
            storage != "text" for storage in test.spans
        )  # a number range: ids in value order
        costs.append(None if count is None else count * (UNSORTED_PENALTY if unsorted else 1))
    order = sorted(range(len(tests)), key=lambda i: (costs[i] is None, costs[i] or 0))
    first = tests[order[0]] if costs[order[0]] is not None else None
    if first is None:  # != and KEY= only: every item but those of a few sets
        return _all_but(tests, snapshot, low, span)
    if first.spans is not None and _one_value(first, snapshot):  # one slice, in id order
        ((start, stop),) = first.spans["text"]
        candidates = np.asarray(snapshot.columns[first.key].parts["text"].ids[start:stop])
    elif first.spans is not None:  # ids in value order: a bitmap when many, else sorted
        parts = snapshot.columns[first.key].parts
        blocks = [
            np.asarray(parts[s].ids[a:b]) for s, spans in first.spans.items() for a, b in spans
        ]
        size = sum(len(block) for block in blocks)
        if not blocks:
            return np.zeros(0, np.int64)
        if size * LIST_SHARE > span:
            candidates = Blocks(blocks).sorted_ids(low, span)
        else:
            candidates = np.sort(np.concatenate(blocks) if len(blocks) > 1 else blocks[0])
    else:  # KEY!= only: the ids having a value
        candidates = np.asarray(snapshot.columns[first.key].has, np.int64)
    check()
    for position in order:
        test = tests[position]
        if not len(candidates):
            break
        if test is first and not test.excluded and not test.no_value:
            continue  # its spans gave the candidates: nothing of it is left to test
        candidates = candidates[_passes(test, test is first, candidates - low, snapshot, ranks)]
        check()
    return candidates.astype(np.int64, copy=False)


def _one_value(test: KeyTest, snapshot: Snapshot) -> bool:
    """Whether ``test``'s span is one text value's ids (sorted by id; a range of text values
    is sorted by value first)."""
    if test.spans is None or list(test.spans) != ["text"] or len(test.spans["text"]) != 1:
        return False
    starts = snapshot.columns[test.key].parts["text"].starts
    if starts is None:
        return False
    ((start, stop),) = test.spans["text"]
    value = int(np.searchsorted(starts, start, side="right")) - 1
    return stop <= int(starts[value + 1])


def _all_but(tests: list[KeyTest], snapshot: Snapshot, low: int, span: int) -> np.ndarray:
    """The items outside every test's excluded spans (and without a value where KEY=)."""
    all_ids = snapshot.all_ids
    keep = np.ones(span, bool)
    if len(all_ids) != span:  # ids with gaps
        keep[:] = False
        keep[np.asarray(all_ids) - low] = True
    for test in tests:
        parts = snapshot.columns[test.key].parts
        for storage, start, stop in test.excluded:
            keep[np.asarray(parts[storage].ids[start:stop]) - low] = False
        if test.no_value:
            keep[np.asarray(snapshot.columns[test.key].has) - low] = False
    return np.flatnonzero(keep) + low


def _passes(
    test: KeyTest, given: bool, at: np.ndarray, snapshot: Snapshot, ranks: Ranks
) -> np.ndarray:
    """Which candidates (``at``: their offsets from the snapshot's first id) meet ``test``
    (``given``: its spans, or its KEY!=, gave the candidates)."""
    parts = snapshot.columns[test.key].parts
    cache: dict[str, np.ndarray] = {}

    def rank(storage: str) -> np.ndarray:
        if storage not in cache:
            cache[storage] = ranks(test.key, storage)[at]
        return cache[storage]

    ok = np.ones(len(at), bool)
    if test.spans is not None and not given:
        inside = np.zeros(len(at), bool)
        for storage, spans in test.spans.items():
            found = rank(storage)
            for start, stop in spans:
                inside |= (found >= start) & (found < stop)
        ok &= inside
    for storage, start, stop in test.excluded:
        found = rank(storage)
        ok &= ~((found >= start) & (found < stop))
    if (test.has_value and not (given and test.spans is None)) or test.no_value:
        valued = np.zeros(len(at), bool)
        for storage, part in parts.items():
            if len(part.ids):
                valued |= rank(storage) >= 0
        if test.has_value:
            ok &= valued
        if test.no_value:
            ok &= ~valued
    return ok


def part_rank(part: Part, low: int, span: int) -> np.ndarray:
    """Each id's position in ``part``'s value order (-1: not in the part), ids low..low+span."""
    kind = np.int32 if len(part.ids) < 2**31 - 1 else np.int64
    rank = np.full(span, -1, kind)
    rank[np.asarray(part.ids) - low] = np.arange(len(part.ids), dtype=kind)
    return rank
