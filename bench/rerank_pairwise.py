"""The learned pairwise re-ranker (issue 41): its lift on unseen classes and its cost.

    python bench/rerank.py pairwise [--workdir DIR] [--seeds 0 1 2] [--depths 5 10 20 50]
        [--parts quality cost unseen]

Two real sets, each with an embedding trained here from scratch on its training classes (a
ResNet-50, RLL, the CLI's own train and export):
- ``digits``: scikit-learn's handwritten digits at 32 px in the SOP layout
  (bench/defaults_labelled.py), digits 0-4 train, 5-9 test; 60 steps;
- ``synthetic``: ``nearsight data synth`` (40 classes, 20 train / 20 test, 48 px); 150 steps.

For each seed a re-ranker is trained on the training split (``fit_scorer``, classes held out
for the choice of epoch, test classes never read) and exported; every depth is then measured
on the test classes, leave-one-out (Recall@1, MAP@R) beside aqe, dba and kreciprocal at their
defaults and the same depth. Two re-rankers: ``train``, on the embeddings alone (q * c,
|q - c| and the list features: the shipped default), and ``train+layer3``, on the list
features and the trunk's pooled layer3 features of query and candidates (no elementwise
embedding features; nearsight.search.rerank.stage_features reads them from the same ONNX
model in the same run). ``oracle`` (depth 20): the embeddings-only re-ranker trained on the
test classes themselves (not a method: it bounds what an embedding-only re-ranker could
gain). ``layer3 alone``: Recall@1 of the layer3 features themselves (centred on the training
split's mean), what the stage knows by itself.

Cost: a search of a 10,000-item 128-d flat gallery, k = 8, batch 1 and 64: each method called
once a round in turns (1,001 rounds at batch 1, 101 at 64), medians after 20 unmeasured calls,
plain against each method at depth 20 (the file's weights do not
change its cost; its size is the default's). ``pairwise+layer3``: a search by item id through
the gallery with 1024-d layer3 features stored by ``rerank features`` (its file format,
float16, memory-mapped): the base search, the query's and candidates' features read from the
store by id, and the format-2 file's scoring. Run it with OMP_NUM_THREADS=1 on a shared machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from nearsight.search.rerank.evaluate import evaluate_reranked
from nearsight.search.rerank.spec import parse_rerank

CLASSICAL = ("aqe", "dba", "kreciprocal")
# train: the method; oracle: trained on the test classes (a bound, not a method); oracle-list:
# the same without the elementwise features (what the list context alone can give)
SOURCES = ("train", "train+layer3", "oracle")
STAGE = "layer3"
WARM_UP = 20  # cost: calls of each method before timing
ROUNDS = {1: 1001, 64: 101}  # cost: rounds by batch size, each method once a round (medians)


def _cli(*argv) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    command = [sys.executable, "-m", "nearsight.app.cli", *map(str, argv)]
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)


def make_set(name: str, workdir: Path) -> tuple[Path, str, Path]:
    """(data root, dataset kind, trained model.onnx) of ``name``, made once in ``workdir``."""
    root, model = workdir / name, workdir / f"{name}.onnx"
    if name == "digits":
        sys.path.insert(0, str(Path(__file__).parent))
        from defaults_labelled import write_digits_sop

        kind, steps, size, batch = "sop", 60, 32, ["--classes-per-batch", 5, "--per-class", 8]
        if not root.exists():
            write_digits_sop(root)
    else:
        kind, steps, size, batch = "folder", 150, 48, ["--classes-per-batch", 8, "--per-class", 4]
        if not root.exists():
            _cli("data", "synth", "--out", root, "--classes", 40, "--per-class", 20,
                 "--size", size)  # fmt: skip
    if not model.exists():
        run = workdir / f"{name}-run"
        _cli("train", "--dataset", kind, "--root", root, "--loss", "rll", "--out", run,
             "--image-size", size, "--pretrained", "none", "--steps", steps, *batch,
             "--workers", 0, "--eval-every", steps, "--seed", 0)  # fmt: skip
        _cli("export", "--checkpoint", run / "best.pt", "--out", model)
    return root, kind, model


def embedded(root: Path, kind: str, model: Path) -> dict[str, tuple[np.ndarray, ...]]:
    """split -> (embeddings, labels, the trunk's pooled STAGE features), one ONNX run."""
    from nearsight.data.datasets import load_dataset
    from nearsight.search.rerank.stage_features import embed_with_stage

    out = {}
    for split in ("train", "test"):
        data = load_dataset(kind, root, split)
        result, side = embed_with_stage(model, STAGE, [s.path for s in data.samples],
                                        desc=f"{split} split")  # fmt: skip
        out[split] = (result.embeddings, np.asarray(data.labels)[result.ok], side)
    return out


def scores(vectors, labels, spec: str, side=None) -> dict[str, float]:
    metrics = evaluate_reranked(vectors, labels, (1,), parse_rerank(spec), side=side,
                                with_nmi=False)  # fmt: skip
    return {"recall@1": float(metrics["recall@1"]), "map@r": float(metrics["map@r"])}


def stage_alone(sets) -> float:
    """Recall@1 of the test split's STAGE features alone (centred on the training mean)."""
    side = sets["test"][2] - sets["train"][2].mean(0)
    return float(scores(side / np.linalg.norm(side, axis=1, keepdims=True), sets["test"][1],
                        "none")["recall@1"])  # fmt: skip


def quality(name: str, workdir: Path, seeds, depths) -> dict:
    from nearsight.training.pairwise import FitSettings, export_scorer, fit_scorer

    root, kind, model = make_set(name, workdir)
    sets = embedded(root, kind, model)
    test = sets["test"]
    result = {"plain": scores(*test[:2], "none"), f"{STAGE} alone": {"recall@1": stage_alone(sets)},
              "depths": {}}  # fmt: skip
    print(f"\n{name}: {len(sets['train'][1])} train items, {len(test[1])} test items; plain "
          f"Recall@1 {result['plain']['recall@1']:.4f}, MAP@R {result['plain']['map@r']:.4f}; "
          f"{STAGE} alone Recall@1 {result[f'{STAGE} alone']['recall@1']:.4f}")  # fmt: skip
    files: dict[tuple[str, int, int], Path] = {}
    for depth in depths:
        # oracle runs (trained on the test classes themselves) at depth 20 only: they bound
        # what any embedding-only re-ranker of these features could gain
        sources = SOURCES if depth == 20 else SOURCES[:2]
        for seed in seeds:
            for source in sources:
                vectors, labels, side = test if source == "oracle" else sets["train"]
                staged = source.endswith(STAGE)
                settings = FitSettings(depth=depth, seed=seed, elementwise=not staged)
                scorer, report = fit_scorer(vectors, labels, settings, log=lambda line: None,
                                            side=side if staged else None)  # fmt: skip
                files[source, depth, seed] = workdir / f"{name}-{source}-{depth}-{seed}.onnx"
                export_scorer(scorer, files[source, depth, seed], "bench",
                              {"side_stage": STAGE} if staged else None)  # fmt: skip
        row = {}
        for source in sources:
            side = test[2] if source.endswith(STAGE) else None
            runs = [scores(*test[:2], f"pairwise:model={files[source, depth, s]},depth={depth}",
                           side) for s in seeds]  # fmt: skip
            row[f"pairwise ({source})"] = {
                key: [r[key] for r in runs] for key in ("recall@1", "map@r")
            }
        for method in CLASSICAL:
            row[method] = scores(*test[:2], f"{method}:depth={depth}")
        result["depths"][depth] = row
        print(f"  depth {depth}:")
        for method, got in row.items():
            r1, mapr = np.atleast_1d(got["recall@1"]), np.atleast_1d(got["map@r"])
            print(f"    {method:<22} Recall@1 {r1.mean():.4f} (seeds {np.round(r1, 4).tolist()}, "
                  f"lift {r1.mean() - result['plain']['recall@1']:+.4f})  MAP@R {mapr.mean():.4f} "
                  f"({mapr.mean() - result['plain']['map@r']:+.4f})")  # fmt: skip
    return result


def search(gallery, queries: np.ndarray, spec) -> None:
    from nearsight.search.rerank.search import reranked_search

    if spec.active:
        reranked_search(gallery, queries, 8, spec)
    else:
        gallery.search(queries, 8)


def staged_search(gallery, queries, spec, query_ids: np.ndarray) -> None:
    from nearsight.search.rerank.search import reranked_search

    reranked_search(gallery, queries, 8, spec, query_ids=query_ids)


def interleaved(calls: dict, rounds: int) -> dict[str, float]:
    """Median milliseconds of each call, timed in turns: every round calls each once, the
    order rotating, so that a machine whose speed drifts moves every method alike."""
    for call in calls.values():
        for _ in range(WARM_UP):  # onnxruntime's first runs allocate its arena
            call()
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(values)) * 1000 for name, values in times.items()}


def cost(workdir: Path, depth: int = 20, items: int = 10_000) -> dict:
    from nearsight.index.gallery.core import Gallery
    from nearsight.index.gallery.write import write_gallery
    from nearsight.search.rerank.stage_store import write_stage_store
    from nearsight.training.pairwise import FitSettings, PairScorer, export_scorer

    sys.path.insert(0, str(Path(__file__).parent))
    from clustered_vectors import clustered

    reranker = workdir / "cost-128.onnx"
    export_scorer(PairScorer(128, hidden=FitSettings().hidden), reranker, "0" * 64)
    vectors = clustered(items)
    rows = [{"path": f"/x/{i}.png", "label": None, "class_name": None} for i in range(items)]
    folder = write_gallery(workdir / "cost-gallery", vectors, rows, model_sha256="0" * 64,
                           index_type="flat", neighbour_graph=True)  # fmt: skip
    methods = ["none", f"pairwise:model={reranker},depth={depth}",
               *(f"{m}:depth={depth}" for m in CLASSICAL)]  # fmt: skip
    report = {}
    with Gallery.open(folder) as gallery:
        queries = clustered(64, seed=1)
        staged = workdir / f"cost-128-{STAGE}.onnx"
        export_scorer(PairScorer(128, hidden=FitSettings().hidden, elementwise=False,
                                 side_dim=1024), staged, "0" * 64, {"side_stage": STAGE})  # fmt: skip
        rng = np.random.default_rng(0)
        side = np.abs(rng.normal(size=(items, 1024))).astype(np.float32)
        write_stage_store(folder, STAGE, "0" * 64, gallery.ids, side)  # rerank features' file
        query_ids = rng.choice(gallery.ids, size=64, replace=False)
        methods.insert(2, f"pairwise+{STAGE}")
        for batch in (1, 64):
            calls = {}
            for method in methods:
                if method == f"pairwise+{STAGE}":
                    spec = parse_rerank(f"pairwise:model={staged},depth={depth}")
                    calls[method] = lambda q=queries[:batch], r=spec, i=query_ids[:batch]: (
                        staged_search(gallery, q, r, i))  # fmt: skip
                else:
                    spec = parse_rerank(method)
                    calls[method.split(":")[0]] = lambda q=queries[:batch], r=spec: search(
                        gallery, q, r)  # fmt: skip
            medians = interleaved(calls, ROUNDS[batch])
            line = []
            for name, ms in medians.items():
                report[f"{name}@{batch}_ms"] = ms
                line.append(f"{name} {ms:.2f} ms ({ms / medians['none']:.2f}x)")
            print(f"  batch {batch:>2}, depth {depth}: " + "  ".join(line))
    return report


def unseen(workdir: Path, seeds) -> dict:
    """``nearsight rerank train`` itself (default and --stage layer3, each seed, its own
    choice on held-out training classes) on the digits set, scored on the unseen digits 5-9,
    leave-one-out (bench/results/rerank_pairwise_unseen.json)."""
    import json

    from nearsight.search.rerank.pairwise import load_reranker

    root, kind, model = make_set("digits", workdir)
    test = embedded(root, kind, model)["test"]
    plain = scores(*test[:2], "none")["recall@1"]
    runs = []
    for variant, extra in (("default", []), ("layer3", ["--stage", STAGE])):
        for seed in seeds:
            out = workdir / f"unseen-{variant}-{seed}.onnx"
            command = [sys.executable, "-m", "nearsight.app.cli", "rerank", "train", "--model",
                       str(model), "--dataset", kind, "--root", str(root), "--out", str(out),
                       "--seed", str(seed), "--json", *extra]  # fmt: skip
            report = json.loads(subprocess.run(command, capture_output=True, text=True,
                                               check=True).stdout)  # fmt: skip
            opened = load_reranker(out)
            side = test[2] if opened.side_dim else None
            got = scores(*test[:2], f"pairwise:model={out},depth=20", side)["recall@1"]
            runs.append({"variant": variant, "seed": seed, "kept": opened.meta["kept"],
                         "held_out_plain_recall@1": report["plain"]["recall_at_1"],
                         "held_out_chosen_recall@1": report["chosen"]["recall_at_1"],
                         "candidates": report["candidates"], "unseen_recall@1": got})  # fmt: skip
            print(f"  {variant} seed {seed}: {opened.meta['kept']}, unseen Recall@1 "
                  f"{plain:.4f} -> {got:.4f}")  # fmt: skip
    return {"plain_unseen_recall@1": plain, "runs": runs, "load_average": os.getloadavg()}


def run_pairwise(args) -> dict:
    import torch

    torch.set_num_threads(1)  # a shared 2-core machine: one thread fits fastest here
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="nearsight-pairwise-"))
    workdir.mkdir(parents=True, exist_ok=True)
    report = {"load_average_start": os.getloadavg()}
    start = time.perf_counter()
    if "quality" in args.parts:  # no timing: run it beside other work
        for name in ("digits", "synthetic"):
            report[name] = quality(name, workdir, args.seeds, args.depths)
    if "unseen" in args.parts:  # rerank train's own choice, never worse on unseen classes
        report["unseen"] = unseen(workdir, args.seeds)
    if "cost" in args.parts:  # timing: under flock /tmp/nearsight-bench.lock
        print(
            f"\ncost per query, 10,000 items, 128-d, flat, k=8, medians of {ROUNDS} rounds in turns:"
        )
        report["cost"] = cost(workdir)
    report["seconds"] = time.perf_counter() - start
    return report
