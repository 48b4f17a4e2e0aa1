"""Filtered search on every index type: recall@k and latency by filter selectivity, beside flat.

    python bench/filtered_search.py [--items 50000] [--dim 128] [--types flat ivf ...]
                                    [--shares 0.001 0.01 0.1 0.5] [--queries 200] [--k 10]
                                    [--json FILE] [--workdir DIR]

Galleries of --items vectors drawn like bench/index_scale.py's (:func:`embedding_like`), one per
index type, written with write_gallery (tuned as a build tunes them). Each filter allows a share
of the items, in two shapes (and ``none``, the unfiltered search, for reference):

- ``random``: items drawn at random, independent of where they lie;
- ``cap``: the items furthest along one random direction, a region of the space that most
  queries lie outside (the hard case for graph and list indexes).

For each type x shape x share, --queries held-out queries search the gallery through
``Gallery.search(ids=...)`` three ways: as shipped (``route``: exact over the allowed items up
to index.ann.filtered.exact_limit, the index past it), forced through the index (``index``)
and forced exact (``exact``), one FAISS thread unless --threads. Reported per way: recall@k against a float64 brute force over
the allowed items, the share of rows equal to it, whether every row holds min(k, allowed)
allowed items, and the p50 latency of one query; ``vs_flat``: the route's p50 over flat's
route p50 at the same filter (the peer in the same run). Timings on a shared machine are noisy:
the ratios are the numbers to quote. A script, not a test.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
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
SHIPPED = filtered.exact_limit
WAYS = {"route": SHIPPED, "index": lambda depth: 0, "exact": lambda depth: 1 << 62}


def filters(vectors: np.ndarray, shares: list[float], seed: int) -> dict[str, np.ndarray]:
    """name -> sorted allowed ids, for each shape and share; ``none``: every item (the
    unfiltered search, for reference)."""
    rng = np.random.default_rng(seed)
    direction = rng.standard_normal(vectors.shape[1]).astype(np.float32)
    along = vectors @ direction
    out = {"none": np.arange(len(vectors))}
    for share in shares:
        count = max(1, round(share * len(vectors)))
        out[f"random {share:g}"] = np.sort(rng.choice(len(vectors), count, replace=False))
        out[f"cap {share:g}"] = np.sort(np.argsort(-along, kind="stable")[:count])
    return out


def truth(queries: np.ndarray, vectors: np.ndarray, allowed: np.ndarray, k: int) -> np.ndarray:
    scores = queries.astype(np.float64) @ vectors[allowed].astype(np.float64).T
    return allowed[np.argsort(-scores, axis=1, kind="stable")[:, :k]]


def measure(gallery: Gallery, queries: np.ndarray, allowed: np.ndarray, want: np.ndarray,
            k: int) -> dict:  # fmt: skip
    """Recall, exactness, counts and the p50 of one query at a time."""
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
    }


def bench(args: argparse.Namespace, workdir: Path) -> dict:
    total = args.items + args.queries
    data = embedding_like(total, args.dim, clusters=max(10, args.items // 500), seed=0)
    vectors, queries = data[: args.items], data[args.items :]
    named = filters(vectors, args.shares, seed=1)
    wants = {name: truth(queries, vectors, allowed, args.k) for name, allowed in named.items()}
    items = [{"path": f"/bench/{i}.jpg"} for i in range(args.items)]
    results: dict = {"items": args.items, "dim": args.dim, "k": args.k, "queries": args.queries,
                     "threads": args.threads, "exact_limit": SHIPPED(args.k),
                     "types": {}}  # fmt: skip
    for index_type in args.types:
        start = time.perf_counter()
        folder = write_gallery(workdir / index_type, vectors, items, model_sha256="b" * 64,
                               index_type=index_type, embeddings="keep")  # fmt: skip
        built = time.perf_counter() - start
        rows = {}
        with Gallery.open(folder) as gallery:
            for name, allowed in named.items():
                row = {"allowed": len(allowed)}
                for way, limit in WAYS.items():
                    if name == "none" and way != "route":
                        continue  # unfiltered: the index, whatever the limit
                    filtered.exact_limit = limit
                    try:
                        row[way] = measure(gallery, queries, allowed, wants[name], args.k)
                    finally:
                        filtered.exact_limit = SHIPPED
                rows[name] = row
                print(index_type, name, json.dumps(row), file=sys.stderr, flush=True)
            results["types"][index_type] = {"build_s": round(built, 1), "filters": rows,
                                            "meta": {key: gallery.meta.get(key) for key in
                                                     ("nlist", "nprobe", "ef_search")}}  # fmt: skip
        shutil.rmtree(folder)
    flat = results["types"].get("flat")
    for entry in results["types"].values():
        for name, row in entry["filters"].items():
            if flat:
                row["vs_flat"] = round(
                    row["route"]["p50_ms"] / flat["filters"][name]["route"]["p50_ms"], 2
                )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=50_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--types", nargs="+", default=list(TYPES), choices=TYPES)
    parser.add_argument("--shares", nargs="+", type=float, default=list(SHARES))
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
