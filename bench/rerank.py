"""What re-ranking buys and costs (issue 24): quality on labelled galleries, search latency.

    python bench/rerank.py quality [--demo-model runs/demo/trained.onnx] [--json FILE]
    python bench/rerank.py latency [--sizes 10000 100000 1000000] [--json FILE]
    python bench/rerank.py rest [--items 10000] [--queries 60] [--rerank SPEC...] [--json FILE]
    python bench/rerank.py pairwise [--workdir DIR] [--seeds 0 1 2] [--depths 5 10 20 50]

pairwise: the learned re-ranker's lift on unseen classes and its cost (bench/rerank_pairwise.py).

quality: each method family's parameters are chosen on validation classes (the best MAP@R of
nearsight.search.rerank.tune's grid that keeps Recall@1), then Recall@1, Recall@8 and MAP@R are
measured on disjoint test classes, leave-one-out, against plain search. Galleries:
- ``digits``: scikit-learn's bundled handwritten digits (1,797 8x8 images, nothing downloaded),
  raw pixels L2-normalised; validation digits 0-4, test digits 5-9;
- ``demo``: the synthetic generator's unseen classes embedded by the demo's trained model
  (``--demo-model``, the ONNX file ``nearsight demo`` exports): 200 classes drawn with another
  seed, classes 100-149 validation and 150-199 test, none of them seen in training (the demo
  trains on 0-49);
- ``demo-test``: the demo's own test gallery (classes 50-99), tuned on the same validation
  classes 100-149.

latency: ``Gallery.search`` of random clustered unit vectors (128-d, 1,000 classes, the index
type ``auto`` picks), batch 1 and 64, k = 8, each method at its default parameters against
none, median of repeats; DBA both searching the index per candidate and reading the stored
neighbour graph (``index build --neighbour-graph``). rest: ``POST /api/search`` by item id (no embedding: the strictest
ratio) on a served 10k gallery, plain and re-ranked requests interleaved, p50 of each.

A script, not a test; the load average is printed with the numbers.
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

import numpy as np
from clustered_vectors import clustered
from clustered_vectors import unit as _unit

from nearsight.search.rerank.evaluate import evaluate_reranked
from nearsight.search.rerank.spec import parse_rerank
from nearsight.search.rerank.tune import GRID, TuningRow, choose

FAMILIES = ("aqe", "dba", "dba+aqe", "kreciprocal")
KS = (1, 8)


# -- galleries -------------------------------------------------------------------------------


def digits() -> tuple[tuple, tuple]:
    from sklearn.datasets import load_digits

    data = load_digits()
    vectors, labels = _unit(data.data), data.target
    val = labels < 5
    return (vectors[val], labels[val]), (vectors[~val], labels[~val])


def embed_folder(model: Path, folder: Path) -> tuple[np.ndarray, np.ndarray]:
    from nearsight.data.images import load_image
    from nearsight.models.loading import load_embedder

    embedder = load_embedder(model, device="cpu")
    paths = sorted(folder.rglob("*.png"))
    labels = np.array([int(p.parent.name[1:4]) for p in paths])
    vectors = []
    for start in range(0, len(paths), 64):
        images = [load_image(p) for p in paths[start : start + 64]]
        vectors.append(embedder.embed_images(images))
    return _unit(np.concatenate(vectors)), labels


def demo_sets(model: Path, workdir: Path) -> dict[str, tuple[tuple, tuple]]:
    from nearsight.data.datasets.synthetic import write_synthetic

    data = workdir / "synthetic-200"
    if not data.exists():
        write_synthetic(data, classes=200, per_class=24, size=96, seed=1)
    cache = workdir / f"vectors-{model.stem}.npz"  # embedding the 4,800 images takes a minute
    if cache.exists():
        with np.load(cache) as saved:
            vectors, labels = saved["vectors"], saved["labels"]
    else:
        vectors, labels = embed_folder(model, data)
        np.savez(cache, vectors=vectors, labels=labels)
    val = (labels >= 100) & (labels < 150)
    test = labels >= 150
    seen = (labels >= 50) & (labels < 100)  # the demo's test classes, drawn with seed 1
    out = {"demo": ((vectors[val], labels[val]), (vectors[test], labels[test]))}
    out["demo-test"] = ((vectors[val], labels[val]), (vectors[seen], labels[seen]))
    return out


# -- quality ---------------------------------------------------------------------------------


def scores(vectors, labels, text: str) -> dict[str, float]:
    metrics = evaluate_reranked(vectors, labels, KS, parse_rerank(text), with_nmi=False)
    return {key: float(metrics[key]) for key in ("recall@1", "recall@8", "map@r")}


def quality_of(name: str, val, test) -> dict:
    table = {"none": scores(*val, "none")}
    rows = [TuningRow(parse_rerank("none"), table["none"]["recall@1"], table["none"]["map@r"])]
    for text in GRID[1:]:
        got = scores(*val, text)
        rows.append(TuningRow(parse_rerank(text), got["recall@1"], got["map@r"]))
    chosen = {"overall": choose(rows)}
    for family in FAMILIES:
        own = [rows[0], *(row for row in rows if row.spec.method == family)]
        chosen[family] = choose(own)
    result = {"val_items": len(val[1]), "test_items": len(test[1]), "methods": {}}
    base = scores(*test, "none")
    result["methods"]["none"] = {"spec": "none", **base}
    print(f"\n{name}: {len(val[1])} validation items, {len(test[1])} test items")
    print(
        f"  {'method':<12} {'chosen on validation':<40} {'R@1':>6} {'R@8':>6} {'MAP@R':>6} {'MAP@R x':>7}"
    )
    print(
        f"  {'none':<12} {'':<40} {base['recall@1']:6.3f} {base['recall@8']:6.3f} {base['map@r']:6.3f}"
    )
    for key, spec in chosen.items():
        got = scores(*test, str(spec)) if spec.active else base
        ratio = got["map@r"] / base["map@r"]
        result["methods"][key] = {"spec": str(spec), **got, "map@r_ratio": ratio}
        print(
            f"  {key:<12} {str(spec):<40} {got['recall@1']:6.3f} {got['recall@8']:6.3f} "
            f"{got['map@r']:6.3f} {ratio:7.3f}"
        )
    return result


def run_quality(args) -> dict:
    report = {"digits": quality_of("digits", *digits())}
    if args.demo_model:
        workdir = Path(args.workdir or tempfile.mkdtemp(prefix="nearsight-rerank-"))
        for name, (val, test) in demo_sets(args.demo_model, workdir).items():
            report[name] = quality_of(name, val, test)
    return report


# -- latency ---------------------------------------------------------------------------------


def timed(call, repeats: int) -> float:
    call()  # warm-up
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return float(np.median(seconds)) * 1000


def run_latency(args) -> dict:
    from nearsight.index.gallery.core import Gallery
    from nearsight.index.gallery.write import write_gallery

    report = {}
    methods = ["none", *FAMILIES, "dba (graph)", "dba+aqe (graph)"]
    if not args.graph:  # a flat graph of 1M items is 10^12 inner products: DBA left out
        methods = ["none", "aqe", "kreciprocal"]
    for size in args.sizes:
        vectors = clustered(size)
        items = [{"path": f"/x/{i}.png", "label": None, "class_name": None} for i in range(size)]
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            folder = write_gallery(
                Path(tmp) / "g",
                vectors,
                items,
                model_sha256="0" * 64,
                index_type=args.index_type,
                neighbour_graph=args.graph,
            )
            built = time.perf_counter() - start
            with Gallery.open(folder) as gallery:
                row = {"index_type": gallery.index_type, "build_with_graph_s": built}
                queries = clustered(64, seed=1)
                graph = gallery._graph
                for batch in (1, 64):
                    for method in methods:
                        spec = parse_rerank(method.removesuffix(" (graph)"))
                        gallery._graph = graph if method.endswith("(graph)") else None
                        ms = timed(
                            lambda q=queries[:batch], r=spec: gallery.search(q, 8, rerank=r), 5
                        )
                        row[f"{method}@{batch}_ms"] = ms
                report[size] = row
        print(
            f"\n{size} items ({row['index_type']}, built{' with the graph' * args.graph} in "
            f"{built:.1f}s), k=8, ms per batch:"
        )
        for batch in (1, 64):
            base = row[f"none@{batch}_ms"]
            shown = "  ".join(
                f"{m} {row[f'{m}@{batch}_ms']:.1f} ({row[f'{m}@{batch}_ms'] / base:.1f}x)"
                for m in methods
            )
            print(f"  batch {batch:>2}: {shown}")
    return report


# -- REST ------------------------------------------------------------------------------------


def run_rest(args) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="nearsight-rerank-rest-"))
    try:
        return _rest_report(args, workdir)
    finally:  # its model and gallery: 170 MB a run (the suite runs it)
        shutil.rmtree(workdir, ignore_errors=True)


def _rest_report(args, workdir: Path) -> dict:
    import httpx

    sys.path.insert(0, str(Path(__file__).parent))
    import app_latency

    options = app_latency.parse_args(["--items", str(args.items), "--image-size", "64"])
    model, _ = app_latency.make_model(workdir, options)
    images = app_latency.make_images(workdir)
    gallery, _ = app_latency.make_gallery(workdir, model, images, options)
    from nearsight.index.gallery.core import Gallery

    with Gallery.open(gallery) as opened:  # DBA reads the stored graph
        opened.compact(neighbour_graph=True)
    server, url, _, _ = app_latency.start_server(gallery, options)
    report = {}
    try:
        client = httpx.Client(timeout=60, headers={"X-API-Key": app_latency.BENCH_KEY})
        endpoint = url.rstrip("/") + "/api/search"
        rng = np.random.default_rng(0)
        times: dict[str, list[float]] = {"none": [], **{spec: [] for spec in args.rerank}}
        for _ in range(3):  # warm-up
            for spec in times:
                client.post(endpoint, data={"id": "0", "k": "8", "rerank": spec})
        for _ in range(args.queries):
            item = str(int(rng.integers(0, args.items)))
            for spec in times:
                start = time.perf_counter()
                answer = client.post(endpoint, data={"id": item, "k": "8", "rerank": spec})
                times[spec].append(time.perf_counter() - start)
                answer.raise_for_status()
        for spec, seconds in times.items():
            report[spec] = float(np.median(seconds)) * 1000
        print(f"\nREST /api/search by id, {args.items} items, {args.queries} queries each, p50:")
        for spec in times:
            ratio = report[spec] / report["none"]
            report[f"{spec}_ratio"] = ratio
            print(f"  {spec:<12} {report[spec]:6.1f} ms  {ratio:5.2f}x plain (goal <= 2x)")
    finally:
        server.terminate()
        server.wait(timeout=60)
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=["quality", "latency", "rest", "pairwise"])
    parser.add_argument("--demo-model", type=Path, help="the demo's trained ONNX model")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--index-type", default="auto", help="latency: the galleries' index")
    parser.add_argument(
        "--graph",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="latency: build the neighbour graph (and time DBA); --no-graph for 1M items",
    )
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=60)
    parser.add_argument("--rerank", nargs="+", default=list(FAMILIES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="pairwise")
    parser.add_argument("--depths", type=int, nargs="+", default=[5, 10, 20, 50], help="pairwise")
    parser.add_argument("--parts", nargs="+", default=["quality", "cost"],
                        help="pairwise: quality, cost, unseen (rerank train's own choice)")  # fmt: skip
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    parts = {"quality": run_quality, "latency": run_latency, "rest": run_rest}
    if args.part == "pairwise":
        sys.path.insert(0, str(Path(__file__).parent))
        from rerank_pairwise import run_pairwise

        parts["pairwise"] = run_pairwise
    report = parts[args.part](args)
    report["load_average"] = os.getloadavg()
    print(f"\nload average {report['load_average'][0]:.2f} (cores: {os.cpu_count()})")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
