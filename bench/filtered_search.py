"""Filtered search on every index type: recall@k and latency by filter selectivity, beside flat.

    python bench/filtered_search.py [--items 50000] [--dim 128] [--types flat ivf ...]
                                    [--shares 0.001 0.01 0.1 0.5] [--queries 200] [--k 10]
                                    [--shapes random cap category] [--json FILE] [--workdir DIR]
                                    [--reuse DIR [--build-only] [--recalibrate]] [--compare]

--reuse keeps the built galleries (and the filters' true neighbours) in DIR between runs: a
1M HNSW gallery takes minutes to build. Each filter's rows time the whole ``search_vector``
call (wall and the thread's CPU time, the first search apart) and its facets; the load
average is recorded at the start and the end.

Galleries of --items vectors drawn like bench/index_scale.py's (:func:`embedding_like`), one per
index type, written with write_gallery (tuned as a build tunes them). Each filter allows a share
of the items, in two shapes (and ``none``, the unfiltered search, for reference):

- ``random``: items drawn at random, independent of where they lie;
- ``cap``: the items furthest along one random direction, a region of the space that most
  queries lie outside (the hard case for graph and list indexes);
- ``category``: the filter follows the data's clusters (k-means of the items, the clusters
  standing in for a catalog's categories): a group of clusters, none of which holds a query's
  own cluster, as "category = shoes" for the photo of a bag.

For each type x shape x share, --queries held-out queries search the gallery through
``Gallery.search(ids=...)`` three ways: as shipped (``route``: each query exactly or through
the index, whichever the gallery's cost plan finds cheaper for the recall target,
index.ann.filtered), forced through the index (``index``) and forced exact (``exact``), one
FAISS thread unless --threads. Reported per way: recall@k against a float64 brute force over
the allowed items, the share of rows equal to it, whether every row holds min(k, allowed)
allowed items, and the p50 and p95 latency of one query (the ways timed in turns, query by
query); ``vs_flat``: the route's p50 over flat's route p50 at the same filter (the peer in the
same run); ``route_vs_exact``: the route's p50 over the exact search's (``route_vs_exact_p95``:
the same at the p95). Timings on a shared machine are noisy: the ratios are the numbers to
quote. Last, per type, a line in the NeurIPS'23 big-ann filter track's form: the route's
recall@k and its queries per second over every filtered query of the run, one at a time. A
script, not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import faiss
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules

from index_scale import embedding_like  # noqa: E402

from nearsight.index.ann import filtered  # noqa: E402
from nearsight.index.ann.filter_tuning import exact_top  # noqa: E402
from nearsight.index.catalog.rows import (  # noqa: E402
    INSERT_ITEM,
    INSERT_ITEM_META,
    item_meta,
    item_meta_values,
    item_row,
    row_values,
)
from nearsight.index.catalog.sqlite_db import Database  # noqa: E402
from nearsight.index.gallery import write as gallery_write  # noqa: E402
from nearsight.index.gallery.core import Gallery  # noqa: E402
from nearsight.index.gallery.write import write_gallery  # noqa: E402
from nearsight.search.searcher import Searcher, open_gallery  # noqa: E402

TYPES = ("flat", "ivf", "hnsw", "ivfpq", "opq")
SHARES = (0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5)
SHAPES = ("random", "equal", "cap", "category")
CATEGORY_THREADS = 1  # FAISS threads of the categories' k-means (its clusters depend on it)
WAYS = {"route": None, "index": "index", "exact": "exact"}  # filtered.FORCE
CATEGORIES = 256  # k-means clusters standing in for a catalog's categories
TAG_COUNT = 20  # the tag column's distinct tags
BLOCK = 131_072  # items per block of the data's checks and catalog inserts
EVALUATIONS = 50  # evaluations of each filter alone, timed
IN_MEMORY_BYTES = 1 << 30  # larger data lives in a .npy file in the work folder (mapped)


def columns(vectors: np.ndarray, queries: np.ndarray, shares: list[float], seed: int,
            categories: bool = True) -> tuple[dict[str, np.ndarray], dict[str, tuple[str, ...]]]:  # fmt: skip
    """The catalog's filterable columns (name -> one value per item) and the filters on them
    (name -> filter strings), each filter a shape at a share of the items:

    - ``random s``: ``rnd<s``, a uniform number per item (items drawn at random);
    - ``equal s``: ``shop=...``, a text value held by a share s of the items, at random;
    - ``cap s``: ``along>=T``, the items furthest along one random direction, a region of the
      space that most queries lie outside (the hard case for graph and list indexes);
    - ``category s``: ``cat<G``, whole k-means clusters (a catalog's categories) none of which
      holds a query's own cluster, as "category = shoes" for the photo of a bag; ``far``:
      one such category by its name (``cname=c000``);
    - ``and s``: two independent text columns at once (``kw`` of 10 values, ``kw2`` of shares
      10-40%), 1-4% of the items, as in Qdrant's filtered benchmark; ``and category``: a
      category group of 10% and ``kw``, 1%, clustered;
    - ``anyof``: ``kw=a5|a6`` (any of two values, 20%) and ``kw=a7|a8|a9;kw2=b0`` (3%): a
      union of value sets;
    - ``tag``: a tag column (``--list-column``: 1-3 of 20 tags an item, ~10% an item each):
      ``tags=t0``, ``tags=t1|t2`` and ``tags!=t3``;
    - ``none``: no filter (the unfiltered search, for reference).
    """
    rng = np.random.default_rng(seed)
    count = len(vectors)
    direction = rng.standard_normal(vectors.shape[1]).astype(np.float32)
    out: dict[str, np.ndarray] = {
        "rnd": np.round(rng.random(count), 6),
        "along": (vectors @ direction).astype(np.float64),
        "kw": np.char.add("a", rng.integers(0, 10, count).astype(str)),
        "kw2": np.char.add("b", np.searchsorted([0.1, 0.3, 0.6], rng.random(count),
                                                side="right").astype(str)),
    }  # fmt: skip
    shop = np.full(count, "s0", dtype=object)
    order, taken = rng.permutation(count), 0
    for share in shares:
        size = max(1, round(share * count))
        if taken + size <= count:
            shop[order[taken : taken + size]] = f"s{share:g}"
            taken += size
    out["shop"] = shop.astype(str)
    held = rng.random((count, TAG_COUNT)).argsort(axis=1)[:, :3]  # 3 distinct tags an item
    many = rng.integers(1, 4, count)  # of which it holds 1-3
    out["tags"] = np.array(["|".join(f"t{t}" for t in sorted(row[:n]))
                            for row, n in zip(held.tolist(), many.tolist(), strict=True)])  # fmt: skip
    named: dict[str, tuple[str, ...]] = {"none": ()}
    if categories:  # whole clusters, ranked so that the clusters away from every query come first
        # on one FAISS thread whatever --threads: the clusters differ with the thread count,
        # and a --reuse'd gallery's catalog holds the ones of its build
        threads = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(CATEGORY_THREADS)
        try:
            kmeans = faiss.Kmeans(vectors.shape[1], CATEGORIES, niter=10, seed=seed,
                                  spherical=True, max_points_per_centroid=64)  # fmt: skip
            kmeans.train(np.ascontiguousarray(vectors[:: max(1, count // (CATEGORIES * 64))]))
            label = np.concatenate([kmeans.index.search(
                np.ascontiguousarray(vectors[s : s + BLOCK]), 1)[1][:, 0]
                for s in range(0, count, BLOCK)])  # fmt: skip
            own = set(kmeans.index.search(queries, 1)[1][:, 0].tolist())
        finally:
            faiss.omp_set_num_threads(threads)
        away = [c for c in rng.permutation(CATEGORIES) if c not in own]
        ranked = [*away, *(c for c in range(CATEGORIES) if c in own)]
        rank = np.empty(CATEGORIES, np.int64)
        rank[ranked] = np.arange(CATEGORIES)
        out["cat"] = rank[label]
        out["cname"] = np.char.add("c", np.char.zfill(out["cat"].astype(str), 3))
        sizes = np.bincount(out["cat"], minlength=CATEGORIES)
        named["far"] = ("cname=c000",)
    ordered = np.sort(out["along"])[::-1]
    for share in shares:
        size = max(1, round(share * count))
        named[f"random {share:g}"] = (f"rnd<{share!r}",)
        named[f"equal {share:g}"] = (f"shop=s{share:g}",)
        named[f"cap {share:g}"] = (f"along>={float(ordered[size - 1])!r}",)
        if categories:
            group = int(np.searchsorted(np.cumsum(sizes[: len(away)]), size)) + 1
            named[f"category {share:g}"] = (f"cat<{min(group, len(away))}",)
    named["and 0.01"] = ("kw=a1", "kw2=b0")
    named["and 0.02"] = ("kw=a2", "kw2=b1")
    named["and 0.04"] = ("kw=a3", "kw2=b3")
    named["anyof 0.2"] = ("kw=a5|a6",)
    named["anyof and 0.03"] = ("kw=a7|a8|a9", "kw2=b0")
    named["tag 0.1"] = ("tags=t0",)
    named["tag anyof 0.2"] = ("tags=t1|t2",)
    named["tag not 0.9"] = ("tags!=t3",)
    if categories:
        group = int(np.searchsorted(np.cumsum(sizes[: len(away)]), 0.1 * count)) + 1
        named["and category"] = (f"cat<{min(group, len(away))}", "kw=a4")
    return out, named


def time_facets(searcher: Searcher, strings: tuple[str, ...], repeats: int = 5) -> dict:
    """The facets of a filter's items (every column, read from the gallery's memory-mapped
    payload index), timed ``repeats`` times after one warm call, wall and thread CPU time:
    the filter's evaluation and the counting together."""
    searcher.facets(filters=list(strings) or None)
    times, cpu = [], []
    for _ in range(repeats):
        start, work = time.perf_counter(), time.thread_time()
        searcher.facets(filters=list(strings) or None)
        times.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - work)
    return {"p50_ms": round(float(np.median(times)) * 1000, 2),
            "max_ms": round(max(times) * 1000, 2),
            "cpu_p50_ms": round(float(np.median(cpu)) * 1000, 2),
            "cpu_max_ms": round(max(cpu) * 1000, 2)}  # fmt: skip


def allowed_by(values: dict[str, np.ndarray], strings: tuple[str, ...]) -> np.ndarray:
    """The sorted ids a filter allows, found from the columns here (not through the gallery)."""
    mask = np.ones(len(next(iter(values.values()))), bool)
    for text in strings:
        key, op, raw = re.fullmatch(r"(\w+)(>=|!=|<|=)(.*)", text).groups()
        column = values[key]
        if key == "tags":  # a tag column: whether the item holds one of the tags
            wanted = set(raw.split("|"))
            holds = np.array([not wanted.isdisjoint(cell.split("|")) for cell in column])
            mask &= holds if op == "=" else ~holds
            continue
        if "|" in raw:  # any of
            mask &= np.isin(column, raw.split("|"))
            continue
        value = raw if column.dtype.kind == "U" else float(raw)
        mask &= {"=": column == value, "<": column < value, ">=": column >= value}[op]
    return np.flatnonzero(mask)


@contextlib.contextmanager
def forced(way: str | None) -> Iterator[None]:
    """Every filtered query ``way`` (None: as the route chooses). A tree from before the cost
    plan (a baseline run) had a fixed count instead: forced through ``exact_limit``."""
    if hasattr(filtered, "FORCE"):
        filtered.FORCE = way
    else:
        shipped = filtered.exact_limit
        if way is not None:
            filtered.exact_limit = lambda depth: 0 if way == "index" else 1 << 62
    try:
        yield
    finally:
        if hasattr(filtered, "FORCE"):
            filtered.FORCE = None
        else:
            filtered.exact_limit = shipped


def truth(queries: np.ndarray, vectors: np.ndarray, allowed: np.ndarray, k: int) -> np.ndarray:
    """The allowed ids of each query's k top inner products in float64, ties by the lower id:
    the build's own blocked scan (filter_tuning.exact_top), fed float64, so that memory stays
    bounded at 10M items (no float64 copy of the allowed items, no [Q, allowed] matrix)."""
    return exact_top(
        queries.astype(np.float64), lambda block: np.asarray(vectors[block], np.float64), allowed, k
    )


class Items(Sequence):
    """The catalog rows ``{"path": ..., "meta": {...}}`` of the gallery, made when read (10M
    dicts held at once are ~2.7 GB); ``values``: each column's value per item."""

    def __init__(self, count: int, values: dict[str, np.ndarray]) -> None:
        self.count = count
        self.values = values

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index):  # noqa: ANN001 (int or slice, as a list)
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.count))]
        index = index + self.count if index < 0 else index
        if not 0 <= index < self.count:
            raise IndexError(index)
        meta = {key: column[index].item() for key, column in self.values.items()}
        return {"path": f"/bench/{index}.jpg", "meta": meta}


def check_in_blocks(vectors: np.ndarray, count: int, dim: int | None = None) -> np.ndarray:
    """write_gallery's checks of its vectors (index.gallery.write.check_vectors), BLOCK rows
    at a time: the one-shot check makes a temporary the size of the data (x * x inside
    np.linalg.norm), 5 GB at 10M x 128. Used for data past IN_MEMORY_BYTES only."""
    array = np.asarray(vectors)
    if array.dtype != np.float32 or not array.flags.c_contiguous or array.ndim != 2:
        return CHECK_VECTORS(vectors, count, dim)
    if len(array) != count or (dim is not None and array.shape[1] != dim):
        return CHECK_VECTORS(vectors, count, dim)
    for start in range(0, len(array), BLOCK):
        CHECK_VECTORS(array[start : start + BLOCK], len(array[start : start + BLOCK]), dim)
    return array


CHECK_VECTORS = gallery_write.check_vectors
CREATE_CATALOG = gallery_write.create_catalog


def catalog_in_blocks(db_path: Path, items: Sequence[dict], meta: dict) -> None:
    """index.catalog.create.create_catalog's catalog (the same tables, rows and meta), its
    rows inserted BLOCK at a time: create_catalog holds three lists of every row's dicts and
    tuples, ~5 GB at 10M items. Used for data past IN_MEMORY_BYTES only."""
    ids = [item.get("id", position) for position, item in enumerate(items)]
    CREATE_CATALOG(db_path, items[:1], {**meta, "next_id": max(ids) + 1})
    db = Database(db_path)
    try:
        with db.conn:
            for start in range(1, len(items), BLOCK):
                block = [items[i] for i in range(start, min(start + BLOCK, len(items)))]
                rows = [item_row(item, start + i) for i, item in enumerate(block)]
                extras = [item_meta(item) for item in block]
                db.conn.executemany(INSERT_ITEM, [row_values(row) for row in rows])
                db.conn.executemany(INSERT_ITEM_META, item_meta_values(rows, extras))
    finally:
        db.close()


class PeakMemory:
    """The process's peak resident memory: VmHWM (every mapped page it touched, the mapped
    .npy files' included) and the peak of RssAnon (its own allocations), sampled every
    0.2 s on a thread."""

    def __init__(self) -> None:
        self.anon_peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def status() -> dict[str, float]:
        out = {}
        with open("/proc/self/status") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                    out[key] = int(value.split()[0]) / 1024
        return out

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.anon_peak_mb = max(self.anon_peak_mb, self.status().get("RssAnon", 0.0))

    def report(self) -> dict[str, float]:
        now = self.status()
        self.anon_peak_mb = max(self.anon_peak_mb, now.get("RssAnon", 0.0))
        return {"vm_hwm_mb": round(now.get("VmHWM", 0.0)),
                "rss_anon_peak_mb": round(self.anon_peak_mb)}  # fmt: skip


def outcome(gallery: Gallery, queries: np.ndarray, allowed: np.ndarray, want: np.ndarray,
            k: int) -> dict:  # fmt: skip
    """Recall, exactness and counts of one way (the forced one), all queries at once."""
    info: dict = {}
    try:
        _, ids = gallery.search(queries, k, ids=allowed, info=info)
    except TypeError:  # a tree from before the plan (baseline): no info
        _, ids = gallery.search(queries, k, ids=allowed)
    depth = want.shape[1]
    full = ids.shape == (len(queries), depth) and bool(np.isin(ids, allowed).all())
    hits = [len(set(a) & set(b)) for a, b in zip(ids.tolist(), want.tolist(), strict=True)]
    return {
        "recall": round(float(np.sum(hits) / want.size), 4),
        "same_rows": round(float((ids == want).all(axis=1).mean()), 4),
        "full_rows": full,
        **({"went_exact": info["exact"], "notes": info["notes"]} if "exact" in info else {}),
    }


def measure(gallery: Gallery, queries: np.ndarray, allowed: np.ndarray, want: np.ndarray,
            k: int, ways: Sequence[str]) -> dict[str, dict]:  # fmt: skip
    """Per way: :func:`outcome` and the p50 and p95 of one query, timed in turns (each query goes
    every way before the next query, in each order in turn: every way follows every other
    equally often, as a long index walk slows whatever comes next), so that a machine whose
    speed drifts moves every way alike and ``route_vs_exact`` compares like with like."""
    rows = {}
    for way in ways:
        with forced(WAYS[way]):
            rows[way] = outcome(gallery, queries, allowed, want, k)
    times: dict[str, list[float]] = {way: [] for way in ways}
    orders = list(itertools.permutations(ways))
    for turn, query in enumerate(queries):
        for way in orders[turn % len(orders)]:
            with forced(WAYS[way]):
                start = time.perf_counter()
                gallery.search(query[None], k, ids=allowed)
                times[way].append(time.perf_counter() - start)
    for way in ways:
        rows[way]["p50_ms"] = round(float(np.median(times[way]) * 1000), 3)
        rows[way]["p95_ms"] = round(float(np.percentile(times[way], 95) * 1000), 3)
        rows[way]["total_s"] = round(float(np.sum(times[way])), 4)
    return rows


def make_data(args: argparse.Namespace, workdir: Path) -> Path | np.ndarray:
    """The items and then the queries, in memory, or past IN_MEMORY_BYTES in a .npy file in
    ``workdir`` (its path: opened, mapped, by each step that reads it, so that the pages it
    touched leave the process when it is done)."""
    total = args.items + args.queries
    clusters = max(10, args.items // 500)
    if total * args.dim * 4 <= IN_MEMORY_BYTES:
        return embedding_like(total, args.dim, clusters, 0)
    path = workdir / "data.npy"
    out = np.lib.format.open_memmap(path, "w+", np.float32, (total, args.dim))
    embedding_like(total, args.dim, clusters, 0, out=out)
    out.flush()
    del out
    return path


def opened(data: Path | np.ndarray) -> np.ndarray:
    return np.load(data, mmap_mode="r") if isinstance(data, Path) else data


def end_to_end(searcher: Searcher, queries: np.ndarray, strings: tuple[str, ...],
               want: np.ndarray, k: int) -> dict:  # fmt: skip
    """The whole ``search_vector`` call per query (the filter parsed, typed and evaluated from
    the payload index, then the route), the filter's first search apart; recall@k against
    the float64 brute force; and the filter's evaluation alone (``Searcher.filtered``)."""
    filters = list(strings) or None
    times, cpu, hits, exact, lists = [], [], 0, 0, 0
    for query, wanted in zip(queries, want.tolist(), strict=True):
        start, work = time.perf_counter(), time.thread_time()
        found = searcher.search_vector(query, k=k, filters=filters)
        times.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - work)
        hits += len({hit.id for hit in found} & set(wanted))
        exact += searcher.gallery._filters.last.get("exact", 0) if filters else 0
        lists += searcher.gallery._filters.last.get("coarse", 0) if filters else 0
    evaluation, evaluation_cpu = [], []
    for _ in range(EVALUATIONS if filters else 0):
        start, work = time.perf_counter(), time.thread_time()
        searcher.filtered(filters)
        evaluation.append(time.perf_counter() - start)
        evaluation_cpu.append(time.thread_time() - work)
    ms, cpu_ms = np.asarray(times) * 1000, np.asarray(cpu) * 1000
    return {
        "recall": round(hits / max(1, want.size), 4),
        "first_ms": round(float(ms[0]), 3),
        "p50_ms": round(float(np.median(ms)), 3),
        "p99_ms": round(float(np.percentile(ms, 99)), 3),
        "max_ms": round(float(ms.max()), 3),
        "rest_p99_ms": round(float(np.percentile(ms[1:], 99)), 3) if len(ms) > 1 else None,
        # the thread's own CPU time: what a machine no other process waits on would show
        "cpu_first_ms": round(float(cpu_ms[0]), 3),
        "cpu_p50_ms": round(float(np.median(cpu_ms)), 3),
        "cpu_p99_ms": round(float(np.percentile(cpu_ms, 99)), 3),
        "went_exact": exact,
        "went_coarse": lists,  # HNSW: the exact way over the partition's nearest lists
        **({"eval_p50_ms": round(float(np.median(evaluation) * 1000), 3),
            "eval_max_ms": round(float(np.max(evaluation) * 1000), 3),
            "eval_cpu_max_ms": round(float(np.max(evaluation_cpu) * 1000), 3)}
           if evaluation else {}),
    }  # fmt: skip


def partition_meta(gallery: Gallery) -> dict | None:
    """An HNSW gallery's coarse partition (index.ann.coarse), if it has one."""
    partition = gallery._filters.partition
    if partition is None:
        return None
    return {"nlist": partition.nlist, "beta": partition.beta,
            "tuned_recall": partition.tuned_recall}  # fmt: skip


def truths(queries: np.ndarray, data: Path | np.ndarray, items: int, named: dict,
           allowed: dict, k: int, cache: Path | None) -> dict[str, np.ndarray]:  # fmt: skip
    """Each filter's true top-k per query, kept in ``cache`` (a .npz) when given, beside a
    fingerprint of each filter's allowed ids (a category's k-means clusters differ with the
    FAISS thread count: a truth made for other ids is made again)."""
    prints = {f"{name}#ids": np.frombuffer(hashlib.sha256(allowed[name].tobytes()).digest(),
                                           np.uint8) for name in named}  # fmt: skip
    if cache is not None and cache.is_file():
        with np.load(cache) as stored:
            if set(stored.files) == {*named, *prints} and all(
                np.array_equal(stored[key], value) for key, value in prints.items()
            ):
                return {name: stored[name] for name in named}
    vectors = opened(data)[:items]
    found = {name: truth(queries, vectors, allowed[name], k) for name in named}
    if cache is not None:
        np.savez(cache, **found, **prints)
    return found


def columns_record(args: argparse.Namespace) -> tuple[Path | None, dict]:
    """Where a --reuse folder records what its galleries' catalog columns were made from (the
    shares, and whether categories were drawn), and that record for this run: a gallery built
    with other shares holds other ``shop``/``cat`` values than this run's truths filter."""
    wanted = {"shares": sorted(args.shares), "categories": "category" in args.shapes,
              "category_threads": CATEGORY_THREADS}  # fmt: skip
    if args.reuse is None:
        return None, wanted
    return args.reuse / f"columns-{args.items}-{args.dim}.json", wanted


def bench(args: argparse.Namespace, workdir: Path, memory: PeakMemory) -> dict:
    record, columns_wanted = columns_record(args)
    if record is not None and record.is_file():
        built_with = json.loads(record.read_text())
        if built_with != columns_wanted:
            raise SystemExit(f"--reuse {args.reuse}: its galleries' columns were made with "
                             f"{built_with}, not {columns_wanted}: run with those --shares and "
                             "--shapes, or give another --reuse folder")  # fmt: skip
    data = make_data(args, workdir)
    vectors = opened(data)[: args.items]
    queries = np.array(opened(data)[args.items :])
    values, named = columns(vectors, queries, args.shares, seed=1,
                            categories="category" in args.shapes)  # fmt: skip
    named = {name: strings for name, strings in named.items()
             if name.split()[0] in (*args.shapes, "none", "and", "far", "anyof", "tag")}  # fmt: skip
    allowed = {name: allowed_by(values, strings) if strings else np.arange(args.items)
               for name, strings in named.items()}  # fmt: skip
    del vectors  # unmapped: its pages leave this process (still in the page cache)
    cache = None if args.reuse is None else args.reuse / f"truth-{args.items}-{args.dim}.npz"
    wants = truths(queries, data, args.items, named, allowed, args.k, cache)
    print("truths made", json.dumps(memory.report()), file=sys.stderr, flush=True)
    items = Items(args.items, values)
    if isinstance(data, Path):
        gallery_write.check_vectors = check_in_blocks
        gallery_write.create_catalog = catalog_in_blocks
    results: dict = {"items": args.items, "dim": args.dim, "k": args.k, "queries": args.queries,
                     "threads": args.threads, "types": {}}  # fmt: skip
    for index_type in args.types:
        start = time.perf_counter()
        folder = (args.reuse or workdir) / f"{index_type}-{args.items}-{args.dim}"
        if args.reuse is None or not folder.exists():
            write_gallery(folder, opened(data)[: args.items], items, model_sha256="b" * 64,
                          index_type=index_type, embeddings="keep",
                          meta={"list_columns": ["tags"], "meta_types": {"tags": "str"}})  # fmt: skip
            if record is not None:
                record.write_text(json.dumps(columns_wanted) + "\n")
        built = time.perf_counter() - start
        if args.build_only:
            print(index_type, "built in", round(built, 1), "s", file=sys.stderr, flush=True)
            continue
        rows = {}
        start = time.perf_counter()
        with open_gallery(folder) as searcher:
            opened_s = time.perf_counter() - start
            gallery = searcher.gallery
            if args.recalibrate:  # this run's own costs (threads, load), in memory
                gallery._filters.costs = gallery._search._calibrate_filters()
            # the vectors read once before timing (into the page cache), as in a server that
            # has run a while: a gallery left unread since its build times its disk otherwise
            float(np.asarray(gallery.embeddings[:: max(1, 4096 // (4 * args.dim))]).sum())
            for name, strings in named.items():
                row = {"filter": ";".join(strings), "allowed": len(allowed[name]),
                       "search_vector": end_to_end(searcher, queries, strings, wants[name],
                                                   args.k)}  # fmt: skip
                if index_type == args.types[0]:  # facets: the same on every index type
                    row["facets"] = time_facets(searcher, strings)
                if args.compare and strings:  # the route's two ways, given the allowed ids
                    row.update(measure(gallery, queries, allowed[name], wants[name], args.k,
                                       list(WAYS)))  # fmt: skip
                rows[name] = row
                print(index_type, name, json.dumps(row), file=sys.stderr, flush=True)
            results["types"][index_type] = {"build_s": round(built, 1), "open_s": round(opened_s, 2),
                                            "filters": rows,
                                            "meta": {key: gallery.meta.get(key) for key in
                                                     ("nlist", "nprobe", "ef_search",
                                                      "filter_route")},
                                            "costs_used": gallery._filters.machine_costs()
                                            .as_meta(),
                                            "partition": partition_meta(gallery)}  # fmt: skip
        results["types"][index_type]["memory"] = memory.report()
        print(index_type, "built and measured", json.dumps(memory.report()), file=sys.stderr,
              flush=True)  # fmt: skip
        if args.reuse is None:
            shutil.rmtree(folder)
        if args.json:  # what is done so far, should a long run stop before its end
            args.json.write_text(json.dumps(results, indent=1) + "\n")
    for index_type, entry in results["types"].items():
        filtered_rows = [row["search_vector"] for name, row in entry["filters"].items()
                         if name != "none"]  # fmt: skip
        if filtered_rows:
            entry["summary"] = {
                "recall_min": min(row["recall"] for row in filtered_rows),
                "p50_ms_max": max(row["p50_ms"] for row in filtered_rows),
                "p99_ms_max": max(row["p99_ms"] for row in filtered_rows),
                "first_ms_max": max(row["first_ms"] for row in filtered_rows),
                "eval_max_ms": max(row.get("eval_max_ms", 0.0) for row in filtered_rows),
                "eval_p50_ms_max": max(row.get("eval_p50_ms", 0.0) for row in filtered_rows),
                "cpu_p50_ms_max": max(row["cpu_p50_ms"] for row in filtered_rows),
                "cpu_p99_ms_max": max(row["cpu_p99_ms"] for row in filtered_rows),
                "eval_cpu_max_ms": max(row.get("eval_cpu_max_ms", 0.0) for row in filtered_rows),
            }  # fmt: skip
            print(index_type, "summary", json.dumps(entry["summary"]), file=sys.stderr)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=50_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--types", nargs="+", default=list(TYPES), choices=TYPES)
    parser.add_argument("--shares", nargs="+", type=float, default=list(SHARES))
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=SHAPES)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="FAISS threads (1: on a shared machine one query "
        "on 2 threads waits milliseconds at OpenMP barriers)",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument(
        "--compare",
        action="store_true",
        help="also time the route's ways (as shipped, forced through the "
        "index, forced exact) given the allowed ids, through Gallery.search",
    )
    parser.add_argument(
        "--recalibrate",
        action="store_true",
        help="measure the filter route's costs again on opening each gallery, with this "
        "run's FAISS threads (a gallery reused from a build with --threads 2 timed its "
        "one-query searches with OpenMP's second thread spinning: gate and plan 30x dearer)",
    )
    parser.add_argument(
        "--build-only", action="store_true", help="build the galleries (into --reuse) and stop"
    )
    parser.add_argument(
        "--reuse",
        type=Path,
        help="keep the galleries in this folder and open them on later runs instead of "
        "building them again (same --items and --dim: the data is seeded)",
    )
    args = parser.parse_args(argv)
    faiss.omp_set_num_threads(args.threads)
    for folder in (args.workdir, args.reuse):
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="filtered-bench-", dir=args.workdir))
    memory = PeakMemory()
    loadavg_start = Path("/proc/loadavg").read_text().split()[:3]
    try:
        results = bench(args, workdir, memory)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results["memory"] = memory.report()
    # the load average at the start and at the end (a shared machine: the wall times carry it)
    results["loadavg_start"] = loadavg_start
    results["loadavg"] = Path("/proc/loadavg").read_text().split()[:3]
    text = json.dumps(results, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
