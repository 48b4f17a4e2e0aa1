"""A catalog's filters in SQL and on its column arrays (nearsight/index/catalog/columns.py).

    python bench/catalog_columns.py [--items 2000000] [--repeats 20] [--workdir DIR] [--keep]

--items items with ``category`` (300 values), ``price`` (0-100, two decimals) and ``shop``
(17 names), made with create_catalog; per filter: the ids from ``Catalog.filter_ids`` in SQL
(its first call, as a one-off search runs it), the time the column read took on its thread,
and the p50 of --repeats calls on the arrays (the same ids, checked). Last: the arrays' bytes
and the peak RSS. A script, not a test.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from nearsight.index.catalog.create import create_catalog
from nearsight.index.catalog.filters import parse_filters
from nearsight.index.catalog.store import Catalog

FILTERS = (["category>=100", "category<130"], ["price<10"], ["shop=s3", "category>=150"])


def make(path: Path, items: int) -> None:
    rng = np.random.default_rng(0)
    category = rng.integers(0, 300, items).tolist()
    price = np.round(rng.random(items) * 100, 2).tolist()
    create_catalog(path, ({"path": f"{i}.jpg", "label": category[i],
                           "meta": {"category": category[i], "price": price[i],
                                    "shop": f"s{category[i] % 17}"}}
                          for i in range(items)), {"dim": 8})  # fmt: skip


def arrays_bytes(catalog: Catalog) -> int:
    snapshot = catalog._columns._snapshot
    total = snapshot.all_ids.nbytes
    for column in snapshot.columns.values():
        total += column.has.nbytes
        for part in column.parts.values():
            total += part.ids.nbytes
            if part.starts is None:
                total += part.values.nbytes
            else:
                total += len(part.values.buffer) + part.values.offsets.nbytes + part.starts.nbytes
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep (and reuse) the catalog")
    args = parser.parse_args(argv)
    folder = Path(args.workdir or tempfile.mkdtemp(prefix="catalog-columns-"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"catalog-{args.items}.db"
    try:
        if not path.exists():
            start = time.perf_counter()
            make(path, args.items)
            print(f"made {args.items} items in {time.perf_counter() - start:.0f} s")
        with Catalog.open(path, readonly=True) as catalog:
            for texts in FILTERS:
                conditions = parse_filters(texts)
                start = time.perf_counter()
                sql = catalog.filter_ids(conditions)
                sql_ms = (time.perf_counter() - start) * 1000
                catalog.filter_ids(conditions)  # the second: starts the read
                start = time.perf_counter()
                catalog._columns.wait()
                read_s = time.perf_counter() - start
                times = []
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    found = catalog.filter_ids(conditions)
                    times.append(time.perf_counter() - start)
                assert np.array_equal(found, sql), texts
                print(f"{' '.join(texts)}: {len(found)} ids, SQL {sql_ms:.1f} ms, column read "
                      f"{read_s:.2f} s, arrays p50 {np.median(times) * 1000:.2f} ms")  # fmt: skip
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
            print(
                f"arrays {arrays_bytes(catalog) / 2**20:.0f} MB, peak RSS {peak} MB, "
                f"load {' '.join(Path('/proc/loadavg').read_text().split()[:3])}"
            )
    finally:
        if not args.keep:
            path.unlink(missing_ok=True)
            if args.workdir is None:
                shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
