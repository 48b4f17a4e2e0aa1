"""``nearsight demo``: the whole pipeline on the embedded synthetic dataset, in one command.

data synth -> train (briefly, a seed loss) -> export ONNX -> index build (the unseen test
classes, once with the trained network and once with the same network before training) ->
eval -> serve both galleries. Each step says what it does and how long it took; a finished step
is reused, so a second run opens the page in seconds. Every step calls the typed function its
own subcommand calls (nearsight.training.run.train, nearsight.models.export.export_onnx,
nearsight.index.gallery.build.build_gallery, nearsight.search.evaluate.evaluate_gallery,
nearsight.app.serve.run.serve), never the command line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nearsight.app.serve.run import DEFAULT_HOST, DEFAULT_PORT, serve
from nearsight.core.errors import NearsightError

DONE_MARKER = "demo-done.json"
# The demo's recipe on top of the library's from-scratch defaults; each choice is measured in
# bench/demo_recipe.py (docs/benchmarks.md, "The demo's recipe").
DEMO_SETTINGS: dict[str, Any] = {
    "data.dataset": "folder",
    "model.pretrained": "auto",  # ImageNet weights when torchvision's cache has them
    # the object covers a fraction of each synthetic image: a crop of 16% of the area (the
    # papers' ImageNet-style setting) would often cut it out and teach noise
    "data.crop_scale": [0.6, 1.0],
    # 1,200 small training images: decoded once, not at every step
    "data.cache_images": True,
    "optim.weight_decay": 1e-4,
    # ICE-(L,M,H): one embedding head on each of layer2, layer3 and layer4, the loss on each,
    # the galleries built on their L2-normalised concatenation. In a few hundred steps from
    # scratch the low and mid layers' colours and patterns carry most of what is learnt.
    "model.heads": ["layer2", "layer3", "layer4"],
    "model.embedding": "concat",
    "sampler.classes_per_batch": 8,
    "sampler.per_class": 4,
    # no checkpoint is chosen on the test classes: the schedule ends at its low rate and the
    # last network is exported; the run evaluates the untrained network and the last one
    "eval_at_start": True,
    "eval_every": 10**9,
    "save_every": 100,
}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the whole pipeline on the synthetic dataset and open the page",
        description="Generate the synthetic dataset, train the ResNet-50 embedding briefly with "
        "a seed loss, export it to ONNX, index the unseen test classes, print Recall@k of the "
        "trained network beside the untrained one's, and serve both galleries (before and after "
        "training) on the page. Finished steps in "
        "--workdir are reused.",
    )
    parser.add_argument("--workdir", type=Path, default=Path("runs/demo"))
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument(
        "--no-launch", action="store_true", help="stop after the gallery and print its Recall@k"
    )
    parser.add_argument("--loss", default="ice", help="seed loss to train with (default ice)")
    parser.add_argument(
        "--train-seconds",
        type=float,
        default=180.0,
        help="training time (default 180; the learning rate decays over it)",
    )
    parser.add_argument("--steps", type=int, help="train this many steps instead of by time")
    parser.add_argument("--image-size", type=int, default=48, help="training crop (default 48)")
    parser.add_argument("--classes", type=int, default=100, help="synthetic classes (default 100)")
    parser.add_argument("--per-class", type=int, default=24, help="images per class (default 24)")
    parser.add_argument("--synth-size", type=int, default=96, help="synthetic image side")
    parser.add_argument("--workers", type=int, default=1, help="DataLoader workers")
    parser.set_defaults(func=run_demo)


def _step(number: int, total: int, what: str, action: Callable[[], Any]) -> Any:
    print(f"[{number}/{total}] {what} ...", flush=True)
    start = time.perf_counter()
    result = action()
    print(f"[{number}/{total}] {what}: done in {time.perf_counter() - start:.1f}s", flush=True)
    return result


def demo_config(args: argparse.Namespace, data: Path):
    """The demo's training run: the library's defaults for the starting point (from scratch
    here: warmup then cosine decay over the time limit, BatchNorm learning, the trunk at the
    head's rate) plus DEMO_SETTINGS; --steps replaces the time limit."""
    from nearsight.training.config import load_config

    settings: dict[str, Any] = {
        **DEMO_SETTINGS,
        "data.root": str(data),
        "data.image_size": args.image_size,
        "data.workers": args.workers,
        "loss.name": args.loss,
        "sampler.classes_per_batch": min(
            DEMO_SETTINGS["sampler.classes_per_batch"], args.classes // 2
        ),
    }
    if args.steps:
        settings.update({"steps": args.steps, "time_limit_s": None})
    else:
        settings.update({"steps": None, "time_limit_s": args.train_seconds})
    return load_config(None, settings)


def run_demo(args: argparse.Namespace) -> int:
    import importlib.util

    for module in ("torch", "torchvision", "onnx"):  # before minutes of making the dataset
        if importlib.util.find_spec(module) is None:
            raise NearsightError(
                f"demo trains a model: {module} is not installed; it comes with nearsight's "
                "[train] extra: pip install 'nearsight[train]'"
            )
    work: Path = args.workdir
    if work.exists() and not work.is_dir():
        raise NearsightError(f"--workdir {work} is a file, not a folder")
    try:
        work.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a file where a parent folder should be, no permission
        raise NearsightError(f"cannot create --workdir {work}: {error.strerror}") from None
    data = work / "data"
    run = work / f"run-{args.loss}"
    untrained_checkpoint = run / "untrained.pt"
    models = {
        "untrained": work / "model-untrained.onnx",
        "trained": work / f"model-{args.loss}.onnx",
    }
    galleries = {"untrained": work / "gallery-untrained", "trained": work / f"gallery-{args.loss}"}
    total = 5 if args.no_launch else 6
    started = time.perf_counter()

    # 1. data
    if (data / "synthetic.json").exists():
        print(f"[1/{total}] synthetic dataset: reusing {data}")
    else:
        from nearsight.data.datasets.synthetic import write_synthetic

        _step(
            1,
            total,
            f"generating the synthetic dataset ({args.classes} classes x {args.per_class} images)",
            lambda: write_synthetic(
                data, classes=args.classes, per_class=args.per_class, size=args.synth_size
            ),
        )

    # 2. train
    config = demo_config(args, data)
    finished = [run / DONE_MARKER, run / "last.pt", untrained_checkpoint]
    if all(path.exists() for path in finished):
        print(f"[2/{total}] training: reusing {run}")
    else:
        if run.exists():
            print(f"[2/{total}] {run} holds an unfinished run: starting it again")
            shutil.rmtree(run)
        how_long = f"{args.steps} steps" if args.steps else f"{args.train_seconds:g}s"
        start_point = "from scratch" if config.model.pretrained == "none" else "ImageNet weights"
        _step(
            2,
            total,
            f"training ResNet-50 with the {args.loss} loss for {how_long} at "
            f"{args.image_size} px ({start_point})",
            lambda: _train(config, run, untrained_checkpoint),
        )
        (run / DONE_MARKER).write_text(json.dumps({"loss": args.loss}))

    # 3. export both networks: the one that trained, and the same network before training
    checkpoints = {"untrained": untrained_checkpoint, "trained": run / "last.pt"}
    stale = [
        name
        for name, model in models.items()
        if not (model.exists() and model.stat().st_mtime >= checkpoints[name].stat().st_mtime)
    ]
    if not stale:
        print(f"[3/{total}] ONNX models: reusing {', '.join(map(str, models.values()))}")
    else:
        from nearsight.models.export import export_onnx

        for name in stale:
            _step(
                3,
                total,
                f"exporting the {name} network to ONNX",
                lambda name=name: export_onnx(checkpoints[name], models[name]),
            )

    # 4. galleries of the unseen test classes, one per network
    for name, gallery in galleries.items():
        if _gallery_matches(gallery, models[name]):
            print(f"[4/{total}] {name} gallery: reusing {gallery}")
        else:
            _step(
                4,
                total,
                f"indexing the unseen test classes with the {name} network",
                lambda name=name, gallery=gallery: _build_gallery(
                    models[name], data, gallery, args.workers
                ),
            )

    # 5. eval: the same images, leave-one-out, before and after training
    trained = _step(
        5, total, "evaluating the galleries", lambda: _gallery_metrics(galleries["trained"])
    )
    untrained = _gallery_metrics(galleries["untrained"])
    _print_comparison(trained, untrained)
    print(
        f"demo ready in {time.perf_counter() - started:.0f}s: galleries "
        f"{galleries['untrained']} and {galleries['trained']}"
    )
    if args.no_launch:
        return 0

    # 6. the page: both galleries, so a query's neighbours can be compared before and after
    print(f"[6/{total}] serving the page (Ctrl-C to stop)")
    serve([galleries["trained"], galleries["untrained"]], host=args.host, port=args.port)
    return 0


def _train(config, run: Path, untrained_checkpoint: Path) -> None:
    """Train, and keep the network as it was before training (the same seed builds the same
    initial weights) for the "before" gallery."""
    import torch

    from nearsight.models.checkpoint import save_checkpoint
    from nearsight.training.builders import build_model
    from nearsight.training.run import train

    result = train(config, run)
    print(result.summary(), flush=True)
    save_checkpoint(untrained_checkpoint, build_model(config, torch.device("cpu")))


def _build_gallery(model: Path, data: Path, out: Path, workers: int) -> None:
    """A gallery of the test split, embedded by ``model`` (as ``nearsight index build``)."""
    from nearsight.index.gallery.build import build_gallery
    from nearsight.index.gallery.sources import dataset_source
    from nearsight.models.loading import load_embedder

    source = dataset_source("folder", data, "test")
    build_gallery(
        load_embedder(model, device="cpu"), source, out, model_path=model, workers=workers
    )


def _gallery_matches(gallery: Path, model: Path) -> bool:
    if not (gallery / "catalog.db").exists() or not model.exists():
        return False
    from nearsight.index.gallery.core import Gallery
    from nearsight.models.loading import load_embedder

    try:
        Gallery.open(gallery, model=load_embedder(model, device="cpu")).close()
    except NearsightError:
        return False
    return True


def _gallery_metrics(gallery: Path) -> dict[str, Any]:
    from nearsight.index.gallery.core import Gallery
    from nearsight.search.evaluate import evaluate_gallery

    opened = Gallery.open(gallery)
    try:
        return evaluate_gallery(opened)
    finally:
        opened.close()


def _print_comparison(trained: dict[str, Any], untrained: dict[str, Any] | None) -> None:
    keys = [k for k in trained if k.startswith("recall@")] + ["nmi", "map@r"]
    print(f"\ntest classes, {trained['queries']} queries (leave-one-out)")
    print(f"{'metric':<12}{'untrained':>11}{'trained':>10}")
    for key in keys:
        before = f"{untrained[key]:.4f}" if untrained and key in untrained else "-"
        print(f"{key:<12}{before:>11}{trained[key]:>10.4f}")
    print()
