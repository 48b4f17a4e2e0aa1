"""Facets of a filtered catalog at scale: the payload index's columns for --items items made in
memory (three number columns and four text columns of 4-256 values, a tag column of 20 tags,
1-3 an item), and the facets of a random filter allowing --share of the items, timed.

    python bench/facets.py [--items 1000000] [--share 0.1] [--repeats 5] [--gallery DIR]

Prints one JSON object: the p50 and max wall and thread CPU time of ``column_facets`` (the
filter's ids given: their evaluation is bench/filtered_search.py's ``eval`` rows). With
``--gallery``, the columns are that gallery's own, read from its memory-mapped payload index
(``payload.idx``, as a server reads them; ``Gallery.facet_summary``), and the filter a random
share of its items. A script, not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from nearsight.index.catalog.column_read import _coded_text, _number_part
from nearsight.index.catalog.columns import Column, Snapshot
from nearsight.index.catalog.facets import column_facets
from nearsight.index.catalog.list_columns import split_tags
from nearsight.index.catalog.payload_index import PayloadIndex


def number_column(ids: np.ndarray, values: np.ndarray) -> Column:
    kind = np.float64 if values.dtype.kind == "f" else np.int64
    rows = np.zeros(len(ids), [("id", np.int64), ("value", kind)])
    rows["id"], rows["value"] = ids, values
    return Column({"real" if kind is np.float64 else "integer": _number_part([rows], kind)})


def text_column(ids: np.ndarray, values: np.ndarray) -> Column:
    return Column({"text": _coded_text(list(zip(ids.tolist(), values.tolist(), strict=True)))})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--share", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gallery", type=Path, help="a built gallery's own payload index")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    if args.gallery is not None:
        return gallery_facets(args.gallery, args.share, args.repeats, rng)
    count = args.items
    ids = np.arange(count, dtype=np.int64)
    columns = {"rnd": number_column(ids, rng.random(count)),
               "along": number_column(ids, rng.normal(size=count)),
               "qty": number_column(ids, rng.integers(0, 9, count))}  # fmt: skip
    for key, distinct in (("kw", 10), ("kw2", 4), ("shop", 6), ("cname", 256)):
        columns[key] = text_column(
            ids, np.char.add("v", rng.integers(0, distinct, count).astype(str))
        )
    held = rng.random((count, 20)).argsort(axis=1)[:, :3]
    many = rng.integers(1, 4, count)
    tags = np.array(["|".join(f"t{t}" for t in sorted(row[:n]))
                     for row, n in zip(held.tolist(), many.tolist(), strict=True)])  # fmt: skip
    columns["tags"] = split_tags(text_column(ids, tags))
    types = {"rnd": "float", "along": "float", "qty": "int", "kw": "str", "kw2": "str",
             "shop": "str", "cname": "str", "tags": "str"}  # fmt: skip
    payload = PayloadIndex(Snapshot(ids, True, columns), None, np.zeros(0, np.int64))
    allowed = np.sort(rng.choice(count, round(args.share * count), replace=False))
    timed = timings(lambda: column_facets(payload, allowed, types), args.repeats)
    print(json.dumps({"items": count, "share": args.share, "columns": len(types), **timed}))
    return 0


def timings(run: Callable[[], object], repeats: int) -> dict:
    """p50 and max of ``repeats`` runs after a warm one, wall and thread CPU ms, and the load."""
    run()
    wall, cpu = [], []
    for _ in range(repeats):
        start, work = time.perf_counter(), time.thread_time()
        run()
        wall.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - work)
    return {"p50_ms": round(float(np.median(wall)) * 1000, 1),
            "max_ms": round(max(wall) * 1000, 1),
            "cpu_p50_ms": round(float(np.median(cpu)) * 1000, 1),
            "cpu_max_ms": round(max(cpu) * 1000, 1),
            "loadavg": Path("/proc/loadavg").read_text().split()[:3]}  # fmt: skip


def gallery_facets(folder: Path, share: float, repeats: int, rng: np.random.Generator) -> int:
    """The facets of a random ``share`` of a built gallery's items, from its payload index."""
    from nearsight.index.gallery.core import Gallery

    with Gallery.open(folder) as gallery:
        ids = np.asarray(gallery.ids)
        allowed = np.sort(rng.choice(ids, round(share * len(ids)), replace=False))
        timed = timings(lambda: gallery.facet_summary(allowed), repeats)
        print(json.dumps({"gallery": str(folder), "items": len(ids), "share": share,
                          "columns": len(gallery.column_types()), **timed}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
