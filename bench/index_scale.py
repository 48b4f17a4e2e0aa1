"""Index types at scale: build time, memory, open time, latency and recall@10, per index type.

    python bench/index_scale.py [--quick] [--items 1000000 10000000] [--types flat ivf ...]
                                [--dim 128] [--queries 1000] [--json FILE] [--workdir DIR]

Realistic vectors (:func:`embedding_like`): a mixture of --clusters overlapping Gaussian
classes in a --latent-dim space (real embeddings have an intrinsic dimension far below 128),
mapped into --dim dimensions with a little isotropic noise and L2-normalised. Neighbours then
straddle the IVF lists as they do in real galleries: recall@10 at nprobe 1 is well below 0.95
(about 0.7 at 1M), so the build-time tuning (index.ann.tuning) has work to do. (Tight clusters
around random centres, the first version of this bench, gave 0.99 at nprobe 1.) They are
written as real galleries with index.gallery.build_gallery for each index type, so build_s
includes training (on a capped sample: 64 points per list, index.ann.faiss_index), adding, the
build-time nprobe/efSearch tuning to 0.95 recall@10 and writing the folder (catalog included).
For each:

- build_s; memory_mb: the FAISS index as serialised (the codes, lists, links and ids it holds
  in RAM; PQ types re-rank from the memory-mapped embeddings.npy, counted apart as
  rerank_source_mb); open_s: Gallery.open;
- p50_ms / p95_ms: one query at a time (--single queries); batch64_p50_ms / batch64_p95_ms per
  batch of 64 and per query;
- recall_at_10: the mean share of the exact 10 nearest (faiss.knn over all the vectors) that
  the gallery returns, on --queries held-out queries drawn like the gallery but not in it.

``--quick``: 1M items only, every type (within ~10 minutes on a quiet 2-core machine). Each
type's latency sampling stops after --time-per-type seconds (a flat search of 1M items is a
full scan). At 10M, ``--items 10000000 --types ivf ivfpq opq``: a flat index (5 GB, exact
scans of seconds per batch) and an HNSW graph (hours to build on 2 cores) are impractical
there, so for types not built the flat index's memory is computed (N x (4 D + 8) bytes) and
reported as ``flat_memory_mb_computed``. The goal at 10M: recall@10 >= 0.95 at p50 <= 10 ms
per query with memory <= 1/4 of the flat index. A script, not a test; timings on a shared
machine are noisy: say so when quoting them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import faiss
import numpy as np

from nearsight.index.ann.tuning import recall_at_k
from nearsight.index.gallery.core import Gallery
from nearsight.index.gallery.files import INDEX_FILE
from nearsight.index.gallery.write import write_gallery

TYPES = ("flat", "ivf", "ivfpq", "opq", "hnsw")
BATCH = 64
MIN_SAMPLES = 10  # latency samples kept past --time-per-type


def embedding_like(
    count: int,
    dim: int,
    clusters: int,
    seed: int,
    latent: int = 16,
    spread: float = 2.0,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """``count`` unit vectors: classes centred ``spread`` apart (in units of their own
    spread) in a ``latent``-dim space, mapped linearly into ``dim`` dims, plus 10% isotropic
    noise; made in chunks (no float64 copy), into ``out`` when given (an array or a mapped
    .npy file, so that 10M x 128 need not be held in memory)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, latent), dtype=np.float32) * np.float32(spread)
    mixing = rng.standard_normal((latent, dim), dtype=np.float32) / np.float32(latent**0.5)
    noise = np.float32(0.1 * (1 + spread**2) ** 0.5 / dim**0.5)
    if out is None:
        out = np.empty((count, dim), np.float32)
    for start in range(0, count, 250_000):
        size = min(250_000, count - start)
        points = centres[rng.integers(0, clusters, size)]
        points += rng.standard_normal((size, latent), dtype=np.float32)
        chunk = points @ mixing
        chunk += rng.standard_normal((size, dim), dtype=np.float32) * noise
        out[start : start + size] = chunk / np.linalg.norm(chunk, axis=1, keepdims=True)
    return out


def percentiles(times_s: list[float], scale: float = 1.0) -> tuple[float, float]:
    ms = np.asarray(times_s) * 1000 / scale
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 95))


def bench_type(
    index_type: str,
    vectors: np.ndarray,
    queries: np.ndarray,
    exact: np.ndarray,
    workdir: Path,
    single: int,
    batches: int,
    time_limit: float,
) -> dict:
    folder = workdir / f"g-{index_type}"
    items = [{"path": f"/bench/{i}"} for i in range(len(vectors))]
    start = time.perf_counter()
    write_gallery(folder, vectors, items, model_sha256="bench", index_type=index_type)
    build_s = time.perf_counter() - start
    del items
    start = time.perf_counter()
    gallery = Gallery.open(folder)
    open_s = time.perf_counter() - start
    try:
        memory_mb = len(faiss.serialize_index(gallery._index)) / 2**20
        gallery.search(queries[:BATCH], 10)  # warm-up
        one: list[float] = []
        for row in queries[:single]:
            start = time.perf_counter()
            gallery.search(row[None], 10)
            one.append(time.perf_counter() - start)
            if sum(one) > time_limit / 2 and len(one) >= MIN_SAMPLES:
                break
        many: list[float] = []
        for number in range(batches):
            rows = queries[(number * BATCH) % len(queries) :][:BATCH]
            start = time.perf_counter()
            gallery.search(rows, 10)
            many.append(time.perf_counter() - start)
            if sum(many) > time_limit / 2 and len(many) >= MIN_SAMPLES:
                break
        _, found = gallery.search(queries, 10)
        untuned = _untuned_recall(gallery, queries, exact)
        p50, p95 = percentiles(one)
        b50, b95 = percentiles(many)
        q50, _ = percentiles(many, BATCH)
        result = {
            "index_type": index_type,
            "items": len(vectors),
            "build_s": round(build_s, 2),
            "memory_mb": round(memory_mb, 1),
            "open_s": round(open_s, 3),
            "p50_ms": round(p50, 3),
            "p95_ms": round(p95, 3),
            "batch64_p50_ms": round(b50, 3),
            "batch64_p95_ms": round(b95, 3),
            "batch64_per_query_p50_ms": round(q50, 3),
            "recall_at_10": round(recall_at_k(found, exact), 4),
            "latency_samples": [len(one), len(many)],
            **untuned,
            "tuned": {
                key: gallery.meta[key]
                for key in ("nlist", "nprobe", "pq_m", "hnsw_m", "ef_search", "tuned_recall_at_10")
                if key in gallery.meta
            },
            "index_file_mb": round((folder / INDEX_FILE).stat().st_size / 2**20, 1),
        }
        if index_type in ("ivfpq", "opq"):
            result["rerank_source_mb"] = round(vectors.nbytes / 2**20, 1)
    finally:
        gallery.close()
        shutil.rmtree(folder, ignore_errors=True)
    return result


def _untuned_recall(gallery: Gallery, queries: np.ndarray, exact: np.ndarray) -> dict:
    """recall@10 at nprobe 1 (IVF types) or efSearch 16 (HNSW): how much work the tuning had."""
    if gallery.index_type in ("ivf", "ivfpq", "opq"):
        ivf = faiss.extract_index_ivf(gallery._index)
        tuned, ivf.nprobe = ivf.nprobe, 1
        _, found = gallery.search(queries, 10)
        ivf.nprobe = tuned
        return {"recall_at_10_nprobe_1": round(recall_at_k(found, exact), 4)}
    if gallery.index_type == "hnsw":
        params = faiss.SearchParametersHNSW(efSearch=16)
        _, found = gallery._index.search(queries, 10, params=params)
        return {"recall_at_10_ef_16": round(recall_at_k(found, exact), 4)}
    return {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1M items only")
    parser.add_argument("--items", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--types", nargs="+", default=list(TYPES), choices=TYPES)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--clusters", type=int, default=1000, help="classes of the data")
    parser.add_argument("--latent-dim", type=int, default=16, help="the data's intrinsic dim")
    parser.add_argument(
        "--time-per-type", type=float, default=15.0, help="seconds of latency sampling per type"
    )
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="FAISS threads (all cores)"
    )
    parser.add_argument("--queries", type=int, default=1000, help="held-out queries for recall")
    parser.add_argument("--single", type=int, default=200, help="queries timed one at a time")
    parser.add_argument("--batches", type=int, default=20, help="batches of 64 timed")
    parser.add_argument("--workdir", type=Path, help="where galleries are written (temp dir)")
    parser.add_argument("--json", type=Path, help="write the results here (after each type)")
    args = parser.parse_args(argv)
    sizes = [1_000_000] if args.quick else args.items
    faiss.omp_set_num_threads(args.threads)
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="index-scale-", dir=args.workdir))
    results: list[dict] = []
    try:
        for size in sizes:
            start = time.perf_counter()
            everything = embedding_like(
                size + args.queries, args.dim, args.clusters, seed=size, latent=args.latent_dim
            )
            vectors, queries = everything[:size], np.ascontiguousarray(everything[size:])
            _, exact = faiss.knn(queries, vectors, 10, metric=faiss.METRIC_INNER_PRODUCT)
            print(f"{size} items: data and exact neighbours in {time.perf_counter() - start:.1f}s",
                  file=sys.stderr)  # fmt: skip
            for index_type in args.types:
                result = bench_type(
                    index_type,
                    vectors,
                    queries,
                    exact,
                    workdir,
                    args.single,
                    args.batches,
                    args.time_per_type,
                )
                if "flat" not in args.types:  # not built: its memory, computed
                    result["flat_memory_mb_computed"] = round(size * (4 * args.dim + 8) / 2**20, 1)
                results.append(result)
                print(json.dumps(result), flush=True)
                if args.json:
                    args.json.write_text(json.dumps(results, indent=1) + "\n")
            del vectors, queries, everything
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    flat = {r["items"]: r["memory_mb"] for r in results if r["index_type"] == "flat"}
    flat |= {
        r["items"]: r["flat_memory_mb_computed"] for r in results if "flat_memory_mb_computed" in r
    }
    for r in results:
        goal = (
            r["recall_at_10"] >= 0.95
            and r["p50_ms"] <= 10
            and (r["items"] not in flat or r["memory_mb"] <= flat[r["items"]] / 4)
        )
        print(
            f"{r['index_type']:>6} {r['items']:>9}: build {r['build_s']:.0f}s, "
            f"{r['memory_mb']:.0f} MB, open {r['open_s']:.2f}s, p50 {r['p50_ms']:.2f} ms, "
            f"p95 {r['p95_ms']:.2f} ms, recall@10 {r['recall_at_10']:.3f}"
            f"{'  (meets the 10M goal)' if goal else ''}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
