"""Gallery search latency and evaluation time, beside pytorch-metric-learning.

    python bench/search.py [--quick] [--sizes 60000 1000000] [--eval-items 60000]
                           [--eval-classes 100] [--repeats 1] [--full-eval] [--threads T]
                           [--json FILE]

1. Query latency of a flat (exact) gallery: random unit vectors (D = 128) are written as a real
   gallery folder (index.gallery.build_gallery, so the 1M case also times building and opening
   it) and searched through ``Gallery.search`` (k = 10, distances included), one query at a
   time (p50/p95 per query over ``--queries`` queries) and in batches of 64 (p50/p95 per batch
   and per query). Default sizes: 60k (SOP's test split) and 1M (where ``auto`` switches to IVF).
2. Evaluation time on ``--eval-items`` clustered vectors with ``--eval-classes`` balanced
   classes (class centres on the sphere plus noise): data.metrics' Recall@1 + NMI (the
   k-means++ seeding ``nearsight eval`` uses: exact up to 1000 classes, AFK-MC2 past that)
   against pytorch-metric-learning's AccuracyCalculator(include=("precision_at_1", "NMI"),
   k=1) on the same vectors, timed in alternation (ours, PML, ours, PML, ...) so that load from
   other processes falls on both alike; the ratio PML / ours > 1 means ours is faster (ours: a
   faiss.knn in query chunks, PML's: a faiss flat index). Also the full ``nearsight eval``
   (Recall@{1,10,100,1000}, NMI, MAP@R) with ``--full-eval``, and a bare torch matmul + argmax
   Recall@1 as a floor for the kNN step.

``--quick``: sizes 20k and 200k, 20k eval items, fewer queries. A script, not a test.
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

from nearsight.data.metrics.retrieval import SOP_KS, evaluate, nmi, recall_at_k
from nearsight.index.gallery.core import Gallery
from nearsight.index.gallery.write import write_gallery
from nearsight.search.evaluate import EXACT_KMEANSPP_MAX_CLASSES

DIM = 128
K = 10
BATCH = 64


def unit_vectors(count: int, dim: int, seed: int) -> np.ndarray:
    """``count`` random unit vectors, made in chunks (1M x 128 is 512 MB; no float64 copy)."""
    rng = np.random.default_rng(seed)
    out = np.empty((count, dim), np.float32)
    for start in range(0, count, 100_000):
        chunk = rng.standard_normal((min(100_000, count - start), dim), dtype=np.float32)
        out[start : start + len(chunk)] = chunk / np.linalg.norm(chunk, axis=1, keepdims=True)
    return out


def clustered(
    count: int, classes: int, dim: int, seed: int, noise: float = 2.2
) -> tuple[np.ndarray, np.ndarray]:
    """Balanced classes around random centres plus Gaussian noise of norm ~``noise`` (2.2 puts
    Recall@1 near 0.7 at 60 items per class: not the trivial ~1 of well separated classes)."""
    rng = np.random.default_rng(seed)
    centres = unit_vectors(classes, dim, seed + 1)
    labels = rng.permutation(np.arange(count) % classes)
    jitter = rng.standard_normal((count, dim), dtype=np.float32) * np.float32(noise / np.sqrt(dim))
    vectors = centres[labels] + jitter
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors, labels


def percentiles(times_s: list[float]) -> dict[str, float]:
    ms = np.asarray(times_s) * 1000
    return {"p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95))}


def bench_latency(size: int, queries: int, batches: int, workdir: Path) -> dict:
    vectors = unit_vectors(size, DIM, seed=size)
    items = [{"path": f"/bench/{i}.jpg"} for i in range(size)]
    start = time.perf_counter()
    folder = write_gallery(
        workdir / f"g{size}", vectors, items, model_sha256="0" * 64, index_type="flat"
    )
    build_s = time.perf_counter() - start
    del items
    start = time.perf_counter()
    gallery = Gallery.open(folder)
    open_s = time.perf_counter() - start
    query_vectors = unit_vectors(max(queries, BATCH * batches), DIM, seed=size + 1)
    gallery.search(query_vectors[:BATCH], K)  # warm-up

    one = []
    for row in query_vectors[:queries]:
        start = time.perf_counter()
        gallery.search(row[None], K)
        one.append(time.perf_counter() - start)
    batch = []
    for number in range(batches):
        block = query_vectors[number * BATCH : (number + 1) * BATCH]
        start = time.perf_counter()
        gallery.search(block, K)
        batch.append(time.perf_counter() - start)
    gallery.close()
    per_query = percentiles([t / BATCH for t in batch])
    return {
        "items": size,
        "build_s": build_s,
        "open_s": open_s,
        "batch1_per_query": percentiles(one),
        "batch64_per_batch": percentiles(batch),
        "batch64_per_query": per_query,
        "queries_per_s_batch64": BATCH / float(np.median(batch)),
    }


def bench_eval(count: int, classes: int, repeats: int, full: bool) -> dict:
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    vectors, labels = clustered(count, classes, DIM, seed=3)
    init = "k-means++" if classes <= EXACT_KMEANSPP_MAX_CLASSES else "afk-mc2"
    calculator = AccuracyCalculator(include=("precision_at_1", "NMI"), k=1, device=_cpu())
    times: dict[str, list[float]] = {"recall": [], "nmi": [], "pml": [], "torch_knn": []}
    values: dict[str, float] = {}

    def timed(name: str, work):
        start = time.perf_counter()
        result = work()
        times[name].append(time.perf_counter() - start)
        return result

    for _ in range(repeats):  # alternate, so that both see the same load
        values["recall@1"] = timed("recall", lambda: recall_at_k(vectors, labels, (1,))[1])
        values["nmi"] = timed("nmi", lambda: nmi(vectors, labels, init=init))
        result = timed("pml", lambda: calculator.get_accuracy(vectors, labels))
        values["pml_precision_at_1"] = float(result["precision_at_1"])
        values["pml_nmi"] = float(result["NMI"])
        values["torch_recall@1"] = timed("torch_knn", lambda: torch_recall_at_1(vectors, labels))
    best = {name: min(spent) for name, spent in times.items()}
    ours_s = best["recall"] + best["nmi"]
    full_result, full_s = None, None
    if full:
        start = time.perf_counter()
        full_result = evaluate(vectors, labels, SOP_KS, nmi_init=init)
        full_s = time.perf_counter() - start
    return {
        "items": count,
        "classes": classes,
        "nmi_init": init,
        "ours_s": ours_s,
        "ours_recall_s": best["recall"],
        "ours_nmi_s": best["nmi"],
        "pml_s": best["pml"],
        "ratio_pml_over_ours": best["pml"] / ours_s,
        "torch_knn_recall_s": best["torch_knn"],
        "values": values,
        "full_eval_s": full_s,
        "full_eval": full_result,
    }


def torch_recall_at_1(vectors: np.ndarray, labels: np.ndarray, chunk: int = 4096) -> float:
    """Floor for the kNN step only: Recall@1 from torch matmul + argmax in query chunks (the
    query itself masked out), to compare data.metrics' matmul + top-k (k + 1) with."""
    import torch

    base = torch.from_numpy(vectors)
    codes = torch.from_numpy(np.asarray(labels))
    hits = 0
    for start in range(0, len(base), chunk):
        scores = base[start : start + chunk] @ base.T
        own = torch.arange(start, start + len(scores))
        scores[torch.arange(len(scores)), own] = -torch.inf
        nearest = scores.argmax(dim=1)
        hits += int((codes[nearest] == codes[own]).sum())
    return hits / len(base)


def _cpu():
    import torch

    return torch.device("cpu")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, a minute or so")
    parser.add_argument("--sizes", type=int, nargs="+", help="gallery sizes for latency")
    parser.add_argument("--queries", type=int, help="single queries timed per size")
    parser.add_argument("--batches", type=int, help="batches of 64 timed per size")
    parser.add_argument("--eval-items", type=int)
    parser.add_argument("--eval-classes", type=int, default=100, help="e.g. 11316 for SOP-like")
    parser.add_argument("--repeats", type=int, default=1, help="alternating eval repeats")
    parser.add_argument(
        "--full-eval", action="store_true", help="also time every `nearsight eval` metric"
    )
    parser.add_argument("--threads", type=int, help="faiss OpenMP threads (default: all)")
    parser.add_argument("--workdir", type=Path, help="where galleries are written (temp dir)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--only", choices=["latency", "eval"], help="run one of the two parts (default both)"
    )
    args = parser.parse_args(argv)

    sizes = args.sizes or ([20_000, 200_000] if args.quick else [60_000, 1_000_000])
    queries = args.queries or (100 if args.quick else 200)
    batches = args.batches
    eval_items = args.eval_items or (20_000 if args.quick else 60_000)
    if args.threads:
        faiss.omp_set_num_threads(args.threads)
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(
        f"faiss {faiss.__version__}, {faiss.omp_get_max_threads()} threads of "
        f"{os.cpu_count()} CPUs (load average {load}), D = {DIM}, k = {K}"
    )

    results: dict = {"latency": [], "eval": None}
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        for size in sizes if args.only != "eval" else []:
            # batches of 64 over 1M vectors take seconds each on a small machine
            row = bench_latency(size, queries, batches or (20 if size <= 200_000 else 8), Path(tmp))
            results["latency"].append(row)
            print(
                f"flat {size:>9,} items: batch 1 p50 {row['batch1_per_query']['p50_ms']:.2f} ms "
                f"p95 {row['batch1_per_query']['p95_ms']:.2f} ms per query; batch 64 "
                f"p50 {row['batch64_per_batch']['p50_ms']:.1f} ms "
                f"p95 {row['batch64_per_batch']['p95_ms']:.1f} ms per batch "
                f"({row['batch64_per_query']['p50_ms']:.3f} ms per query, "
                f"{row['queries_per_s_batch64']:.0f} queries/s); "
                f"build {row['build_s']:.1f} s, open {row['open_s']:.2f} s",
                flush=True,
            )
            shutil.rmtree(Path(tmp, f"g{size}"), ignore_errors=True)  # free the disk

    if args.only == "latency":
        if args.json:
            args.json.write_text(json.dumps(results, indent=1) + "\n")
        return 0
    row = bench_eval(eval_items, args.eval_classes, args.repeats, args.full_eval)
    results["eval"] = row
    values = row["values"]
    print(
        f"eval {row['items']:,} x {DIM} ({row['classes']} classes, NMI seeding "
        f"{row['nmi_init']}): ours (Recall@1 {row['ours_recall_s']:.2f} s + NMI "
        f"{row['ours_nmi_s']:.2f} s) {row['ours_s']:.2f} s, PML AccuracyCalculator "
        f"{row['pml_s']:.2f} s: PML / ours = {row['ratio_pml_over_ours']:.2f}"
    )
    print(
        f"  values: ours recall@1 {values['recall@1']:.4f} nmi {values['nmi']:.4f}; PML "
        f"precision_at_1 {values['pml_precision_at_1']:.4f} NMI {values['pml_nmi']:.4f}"
    )
    print(
        f"  reference: Recall@1 by torch matmul + argmax in 4096-query chunks "
        f"{row['torch_knn_recall_s']:.2f} s (recall@1 {values['torch_recall@1']:.4f})"
    )
    full = row["full_eval"]
    if full is not None:
        print(
            f"  full `nearsight eval` metrics (Recall@1/10/100/1000, NMI, MAP@R) "
            f"{row['full_eval_s']:.2f} s: "
            + ", ".join(f"{k} {v:.4f}" for k, v in full.items() if k != "queries")
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
