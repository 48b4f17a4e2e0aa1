"""bench/gpu_check.py parts ``search`` (FAISS flat and IVF, GPU against CPU, on the gallery's
own index builder) and ``eval`` (the papers' evaluation of a SOP-size gallery, GPU against
CPU)."""

from __future__ import annotations

import contextlib
import inspect
import time
from typing import Any

import numpy as np
from gpu_check_common import Context, Part, Skip, median, time_calls

K = 10  # neighbours per query in the search part


def clustered_vectors(
    count: int, dim: int, classes: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors around ``classes`` random centres (labels = the centre), like the output
    of a trained embedding: IVF lists are uneven and neighbours share a class."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((classes, dim), dtype=np.float32)
    labels = np.arange(count) % classes
    vectors = centres[labels] + 0.8 * rng.standard_normal((count, dim), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.ascontiguousarray(vectors), labels


def make_gallery_index(vectors: np.ndarray, kind: str):
    """The gallery's own index builder (index.gallery.make_index, or where it moved)."""
    try:
        from nearsight.index.ann.faiss_index import make_index
    except ImportError:
        from nearsight.index.ann.faiss_index import make_index
    return make_index(vectors, np.arange(len(vectors), dtype=np.int64), kind)


def faiss_gpu_reason() -> str | None:
    import faiss

    if not hasattr(faiss, "StandardGpuResources"):
        return "this faiss build has no GPU support"
    if faiss.get_num_gpus() < 1:
        return "faiss sees no GPU (faiss.get_num_gpus() == 0)"
    return None


def search_rates(ctx: Context, index: Any, queries: np.ndarray) -> tuple[float, float]:
    """(p50 ms of a single query, queries/s at the batch size)."""
    sizes = ctx.sizes
    singles = [queries[i : i + 1] for i in range(sizes.search_single_queries)]
    latencies = []
    for query in singles:
        start = time.perf_counter()
        index.search(query, K)
        latencies.append(time.perf_counter() - start)
    batch = queries[: sizes.search_batch]
    times = time_calls(ctx, lambda: index.search(batch, K), iterations=3, warmup=1)
    return 1000 * median(latencies[1:] or latencies), len(batch) / median(times)


def overlap_at_k(found: np.ndarray, exact: np.ndarray) -> float:
    """Share of the exact top-k ids that ``found`` also returns (recall@k against flat)."""
    hits = sum(len(np.intersect1d(a, b)) for a, b in zip(found, exact, strict=True))
    return hits / exact.size


def run_search(ctx: Context, part: Part) -> None:
    import faiss

    sizes = ctx.sizes
    vectors, _ = clustered_vectors(sizes.search_items, sizes.search_dim, 1000, seed=0)
    queries, _ = clustered_vectors(max(sizes.search_batch, 64), sizes.search_dim, 1000, seed=1)
    gpu_reason = faiss_gpu_reason() if (ctx.cuda or ctx.smoke) else "needs a CUDA device"
    resources = None if gpu_reason else faiss.StandardGpuResources()
    exact = None
    for kind in ("flat", "ivf"):
        start = time.perf_counter()
        index, params = make_gallery_index(vectors, kind)
        build_s = time.perf_counter() - start
        part.info[f"{kind}_params"] = params
        part.info[f"{kind}_build_cpu_s"] = round(build_s, 1)
        where = f"{kind} {sizes.search_items:,} x {sizes.search_dim}"
        single_cpu, batch_cpu = search_rates(ctx, index, queries)
        _, cpu_ids = index.search(queries[: sizes.search_batch], K)
        if kind == "flat":
            exact = cpu_ids
        recall_cpu = overlap_at_k(cpu_ids, exact)
        part.row(f"{where} CPU, batch 1", round(single_cpu, 3), "ms p50")
        part.row(
            f"{where} CPU, batch {sizes.search_batch}",
            round(batch_cpu, 1),
            "queries/s",
            recall_at_10=round(recall_cpu, 4),
            note=f"build {build_s:.1f} s; recall@10 vs flat {recall_cpu:.3f}",
        )
        if gpu_reason:
            part.skip_row(f"{where} GPU", gpu_reason)
            continue
        gpu = faiss.index_cpu_to_gpu(resources, 0, index)  # as Gallery does
        single_gpu, batch_gpu = search_rates(ctx, gpu, queries)
        _, gpu_ids = gpu.search(queries[: sizes.search_batch], K)
        recall_gpu = overlap_at_k(gpu_ids, exact)
        part.row(
            f"{where} GPU, batch 1",
            round(single_gpu, 3),
            "ms p50",
            peer=round(single_cpu, 3),
            note="peer: CPU latency (ratio < 1: the GPU is faster)",
        )
        part.row(
            f"{where} GPU, batch {sizes.search_batch}",
            round(batch_gpu, 1),
            "queries/s",
            peer=round(batch_cpu, 1),
            recall_at_10=round(recall_gpu, 4),
            note=f"recall@10 vs flat {recall_gpu:.3f}",
        )


@contextlib.contextmanager
def metrics_on_cpu(metrics: Any):
    """The evaluation's kNN on the CPU even where FAISS sees a GPU (data.metrics picks
    faiss.knn_gpu by itself when it can)."""
    if not hasattr(metrics, "_gpu_resources"):
        yield
        return
    original = metrics._gpu_resources
    metrics._gpu_resources = lambda: None
    try:
        yield
    finally:
        metrics._gpu_resources = original


def run_eval(ctx: Context, part: Part) -> None:
    from nearsight.data.metrics import retrieval as metrics

    sizes = ctx.sizes
    vectors, labels = clustered_vectors(sizes.eval_items, 128, sizes.eval_classes, seed=2)
    ks = (1, 10, 100, 1000)
    name = f"evaluate {sizes.eval_items:,} x 128, {sizes.eval_classes:,} classes"
    start = time.perf_counter()
    with metrics_on_cpu(metrics):
        cpu = metrics.evaluate(vectors, labels, ks=ks)
    cpu_s = time.perf_counter() - start
    part.row(f"{name}, CPU", round(cpu_s, 2), "s", note=f"recall@1 {cpu['recall@1']:.4f}")
    if not (ctx.cuda or ctx.smoke):
        part.skip_row(f"{name}, GPU", "needs a CUDA device")
        return
    gpu_s, gpu, how = evaluate_on_device(ctx, metrics, vectors, labels, ks)
    differences = {key: abs(cpu[key] - gpu[key]) for key in cpu if key in gpu and key != "queries"}
    part.row(
        f"{name}, {ctx.device}",
        round(gpu_s, 2),
        "s",
        peer=round(cpu_s, 2),
        max_metric_diff=max(differences.values()),
        note=f"{how}; max metric diff to CPU {max(differences.values()):.2g}",
    )


def evaluate_on_device(
    ctx: Context, metrics: Any, vectors: np.ndarray, labels: np.ndarray, ks: tuple[int, ...]
) -> tuple[float, dict[str, float], str]:
    """The evaluation with its kNN on the GPU, whichever way data.metrics offers it: by
    itself (faiss.knn_gpu when FAISS sees a GPU), ``evaluate(..., device=)``, or its chunked
    torch kNN (``_retrieval_scores(device=)``) plus NMI on the CPU."""
    start = time.perf_counter()
    if hasattr(metrics, "_gpu_resources"):
        reason = faiss_gpu_reason()
        if reason and not ctx.smoke:
            raise Skip(f"GPU evaluation: {reason}")
        result = metrics.evaluate(vectors, labels, ks=ks)
        how = "faiss.knn_gpu" if not reason else f"CPU ({reason})"
        return time.perf_counter() - start, result, how
    if "device" in inspect.signature(metrics.evaluate).parameters:
        result = metrics.evaluate(vectors, labels, ks=ks, device=ctx.device)
        return time.perf_counter() - start, result, "evaluate(device=...)"
    scores = getattr(metrics, "_retrieval_scores", None)
    if scores is None or "device" not in inspect.signature(scores).parameters:
        raise Skip("data.metrics has no evaluation on a device")
    _, codes = np.unique(labels, return_inverse=True)
    recalls, mean_ap = scores(vectors, codes, ks, with_map=True, chunk=4096, device=ctx.device)
    result = {f"recall@{k}": v for k, v in recalls.items()}
    result["map@r"] = mean_ap
    result["nmi"] = metrics.nmi(vectors, labels)
    return time.perf_counter() - start, result, "kNN on the device, NMI (k-means) on the CPU"
