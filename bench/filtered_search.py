"""Filtered search on every index type: recall@k and latency by filter selectivity, beside flat.

    python bench/filtered_search.py [--items 50000] [--dim 128] [--types flat ivf ...]
                                    [--shares 0.001 0.01 0.1 0.5] [--queries 200] [--k 10]
                                    [--shapes random cap category] [--json FILE] [--workdir DIR]

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
allowed items, and the p50 latency of one query; ``vs_flat``: the route's p50 over flat's
route p50 at the same filter (the peer in the same run); ``route_vs_exact``: the route's p50
over the exact search's. Timings on a shared machine are noisy: the ratios are the numbers to
quote. Last, per type, a line in the NeurIPS'23 big-ann filter track's form: the route's
recall@k and its queries per second over every filtered query of the run, one at a time.
A script, not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import faiss
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules

from index_scale import embedding_like  # noqa: E402

from nearsight.index.ann import filtered  # noqa: E402
from nearsight.index.gallery.core import Gallery  # noqa: E402
from nearsight.index.gallery.write import write_gallery  # noqa: E402

TYPES = ("flat", "ivf", "hnsw", "ivfpq", "opq")
SHARES = (0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5)
SHAPES = ("random", "cap", "category")
WAYS = {"route": None, "index": "index", "exact": "exact"}  # filtered.FORCE
CATEGORIES = 256  # k-means clusters standing in for a catalog's categories


def filters(vectors: np.ndarray, queries: np.ndarray, shares: list[float], shapes: list[str],
            seed: int) -> dict[str, np.ndarray]:  # fmt: skip
    """name -> sorted allowed ids, for each shape and share; ``none``: every item (the
    unfiltered search, for reference)."""
    rng = np.random.default_rng(seed)
    direction = rng.standard_normal(vectors.shape[1]).astype(np.float32)
    along = vectors @ direction
    if "category" in shapes:
        kmeans = faiss.Kmeans(vectors.shape[1], CATEGORIES, niter=10, seed=seed, spherical=True,
                              max_points_per_centroid=64)  # fmt: skip
        kmeans.train(vectors)
        label = kmeans.index.search(vectors, 1)[1][:, 0]
        own = set(kmeans.index.search(queries, 1)[1][:, 0].tolist())
        sizes = np.bincount(label, minlength=CATEGORIES)
        away = [c for c in rng.permutation(CATEGORIES) if c not in own]
    out = {"none": np.arange(len(vectors))}
    for share in shares:
        count = max(1, round(share * len(vectors)))
        if "random" in shapes:
            out[f"random {share:g}"] = np.sort(rng.choice(len(vectors), count, replace=False))
        if "cap" in shapes:
            out[f"cap {share:g}"] = np.sort(np.argsort(-along, kind="stable")[:count])
        if "category" in shapes:  # whole clusters away from every query, about count items
            taken = np.cumsum(sizes[away])
            group = away[: int(np.searchsorted(taken, count)) + 1]
            out[f"category {share:g}"] = np.flatnonzero(np.isin(label, group))
    return out


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
    scores = queries.astype(np.float64) @ vectors[allowed].astype(np.float64).T
    return allowed[np.argsort(-scores, axis=1, kind="stable")[:, :k]]


def measure(gallery: Gallery, queries: np.ndarray, allowed: np.ndarray, want: np.ndarray,
            k: int) -> dict:  # fmt: skip
    """Recall, exactness, counts and the p50 of one query at a time."""
    info: dict = {}
    try:
        _, ids = gallery.search(queries, k, ids=allowed, info=info)
    except TypeError:  # a tree from before the plan (baseline): no info
        _, ids = gallery.search(queries, k, ids=allowed)
    depth = want.shape[1]
    full = ids.shape == (len(queries), depth) and bool(np.isin(ids, allowed).all())
    hits = [len(set(a) & set(b)) for a, b in zip(ids.tolist(), want.tolist(), strict=True)]
    times = []
    for query in queries:
        start = time.perf_counter()
        gallery.search(query[None], k, ids=allowed)
        times.append(time.perf_counter() - start)
    return {
        "recall": round(float(np.sum(hits) / want.size), 4),
        "same_rows": round(float((ids == want).all(axis=1).mean()), 4),
        "full_rows": full,
        "p50_ms": round(float(np.median(times) * 1000), 3),
        "total_s": round(float(np.sum(times)), 4),
        **({"went_exact": info["exact"], "notes": info["notes"]} if "exact" in info else {}),
    }


def bench(args: argparse.Namespace, workdir: Path) -> dict:
    total = args.items + args.queries
    data = embedding_like(total, args.dim, clusters=max(10, args.items // 500), seed=0)
    vectors, queries = data[: args.items], data[args.items :]
    named = filters(vectors, queries, args.shares, args.shapes, seed=1)
    wants = {name: truth(queries, vectors, allowed, args.k) for name, allowed in named.items()}
    items = [{"path": f"/bench/{i}.jpg"} for i in range(args.items)]
    results: dict = {"items": args.items, "dim": args.dim, "k": args.k, "queries": args.queries,
                     "threads": args.threads, "types": {}}  # fmt: skip
    for index_type in args.types:
        start = time.perf_counter()
        folder = (args.reuse or workdir) / f"{index_type}-{args.items}-{args.dim}"
        if args.reuse is None or not folder.exists():
            write_gallery(folder, vectors, items, model_sha256="b" * 64, index_type=index_type,
                          embeddings="keep")  # fmt: skip
        built = time.perf_counter() - start
        rows = {}
        with Gallery.open(folder) as gallery:
            # the vectors read once before timing (into the page cache), as in a server that
            # has run a while: a gallery left unread since its build times its disk otherwise
            float(np.asarray(gallery.embeddings[:: max(1, 4096 // (4 * args.dim))]).sum())
            for name, allowed in named.items():
                row = {"allowed": len(allowed)}
                for way, force in WAYS.items():
                    if name == "none" and way != "route":
                        continue  # unfiltered: the index, whatever the way
                    with forced(force):
                        row[way] = measure(gallery, queries, allowed, wants[name], args.k)
                rows[name] = row
                print(index_type, name, json.dumps(row), file=sys.stderr, flush=True)
            results["types"][index_type] = {"build_s": round(built, 1), "filters": rows,
                                            "meta": {key: gallery.meta.get(key) for key in
                                                     ("nlist", "nprobe", "ef_search",
                                                      "filter_route")}}  # fmt: skip
        if args.reuse is None:
            shutil.rmtree(folder)
    flat = results["types"].get("flat")
    for index_type, entry in results["types"].items():
        filtered_rows = [row for name, row in entry["filters"].items() if name != "none"]
        for name, row in entry["filters"].items():
            if flat:
                row["vs_flat"] = round(
                    row["route"]["p50_ms"] / flat["filters"][name]["route"]["p50_ms"], 2
                )
            if "exact" in row:
                row["route_vs_exact"] = round(row["route"]["p50_ms"] / row["exact"]["p50_ms"], 2)
        if filtered_rows:  # the big-ann filter track's form: recall@k at queries per second
            seconds = sum(row["route"]["total_s"] for row in filtered_rows)
            recall = float(np.mean([row["route"]["recall"] for row in filtered_rows]))
            worst = min(row["route"]["recall"] for row in filtered_rows)
            entry["qps_at_recall"] = {
                "recall": round(recall, 4), "worst_filter_recall": worst,
                "qps": round(len(filtered_rows) * args.queries / seconds, 1),
                "threads": args.threads,
            }  # fmt: skip
            print(f"{index_type}: filtered recall@{args.k} {recall:.3f} (worst filter {worst}) "
                  f"at {entry['qps_at_recall']['qps']} QPS, {args.threads} thread(s), one "
                  f"query at a time", file=sys.stderr)  # fmt: skip
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
        "--reuse",
        type=Path,
        help="keep the galleries in this folder and open them on later runs instead of "
        "building them again (same --items and --dim: the data is seeded)",
    )
    args = parser.parse_args(argv)
    faiss.omp_set_num_threads(args.threads)
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="filtered-bench-", dir=args.workdir))
    try:
        results = bench(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    text = json.dumps(results, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
