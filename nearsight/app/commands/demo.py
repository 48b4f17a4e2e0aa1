"""``nearsight demo``: the whole pipeline on the embedded synthetic dataset, in one command.

data synth -> train (the recipe nearsight/training/configs/demo.yaml: a number of steps, so a
busy machine takes longer and learns the same) -> export ONNX -> index build (the unseen test
classes, once with the trained network and once with the same network before training) ->
eval -> serve both galleries. Each step says what it does and how long it took; a finished step
is reused, so a second run opens the page in seconds. Every step calls the typed function its
own subcommand calls (nearsight.training.run.train, nearsight.models.export.export_onnx,
nearsight.index.gallery.build.build_gallery, nearsight.search.evaluate.evaluate_gallery,
nearsight.app.server_app.serve), never the command line.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nearsight.app.serve.settings import Settings
from nearsight.core.errors import NearsightError

DONE_MARKER = "demo-done.json"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the whole pipeline on the synthetic dataset and open the page",
        description="Generate the synthetic dataset, train the ResNet-50 embedding with the "
        "demo's recipe (nearsight/training/configs/demo.yaml) for its number of steps, export it to ONNX, index the unseen test classes, print Recall@k of the "
        "trained network beside the untrained one's, and serve both galleries (before and after "
        "training) on the page. Finished steps in "
        "--workdir are reused.",
    )
    parser.add_argument("--workdir", type=Path, default=Path("runs/demo"))
    parser.add_argument("--host", default=Settings.host)
    parser.add_argument("--port", type=int, default=Settings.port)
    parser.add_argument(
        "--no-launch", action="store_true", help="stop after the gallery and print its Recall@k"
    )
    parser.add_argument("--loss", help="seed loss to train with (default: the recipe's)")
    length = parser.add_mutually_exclusive_group()
    length.add_argument(
        "--steps",
        type=int,
        help="training steps (default: the recipe's, sized for a five-minute demo on a quiet "
        "2-core CPU; a busier machine takes longer and learns the same)",
    )
    length.add_argument(
        "--train-seconds",
        type=float,
        help="train for this many seconds instead of a number of steps (the learning rate "
        "decays over them; a busy machine makes fewer steps and learns less)",
    )
    parser.add_argument("--image-size", type=int, help="training crop (default: the recipe's)")
    parser.add_argument("--classes", type=int, default=100, help="synthetic classes (default 100)")
    parser.add_argument("--per-class", type=int, default=24, help="images per class (default 24)")
    parser.add_argument("--synth-size", type=int, default=96, help="synthetic image side")
    parser.add_argument("--workers", type=int, help="DataLoader workers (default: the recipe's)")
    parser.set_defaults(func=run_demo)


def _step(number: int, total: int, what: str, action: Callable[[], Any]) -> Any:
    print(f"[{number}/{total}] {what} ...", flush=True)
    start = time.perf_counter()
    result = action()
    print(f"[{number}/{total}] {what}: done in {time.perf_counter() - start:.1f}s", flush=True)
    return result


def demo_config(args: argparse.Namespace, data: Path):
    """The demo's training run: the recipe nearsight/training/configs/demo.yaml (on top of the
    library's defaults) with the options given on the command line; --train-seconds replaces
    its step count by a time limit."""
    from nearsight.training.config import DEMO_RECIPE, load_config

    recipe = load_config(DEMO_RECIPE, {"data.root": str(data)})
    settings: dict[str, Any] = {"data.root": str(data)}
    for key, value in (
        ("data.image_size", args.image_size),
        ("data.workers", args.workers),
        ("loss.name", args.loss),
    ):
        if value is not None:
            settings[key] = value
    # a batch takes classes_per_batch of the training classes (half of --classes)
    settings["sampler.classes_per_batch"] = min(
        recipe.sampler.classes_per_batch, max(2, args.classes // 2)
    )
    if args.image_size not in (None, recipe.data.image_size):
        # the expected rate is the recipe's image size's: another size costs another time
        settings["expected_steps_per_s"] = None
    if args.steps is not None and args.steps < 1:
        raise NearsightError(f"--steps must be a positive number of steps, got {args.steps}")
    if args.train_seconds is not None and not args.train_seconds > 0:
        raise NearsightError(f"--train-seconds must be positive, got {args.train_seconds:g}")
    if args.train_seconds is not None:
        settings.update({"steps": None, "time_limit_s": args.train_seconds})
    elif args.steps is not None:
        settings["steps"] = args.steps
    return load_config(DEMO_RECIPE, settings)


def _length(config) -> str:
    """How long the run trains: ``800 steps`` or ``180s``."""
    return f"{config.steps} steps" if config.steps is not None else f"{config.time_limit_s:g}s"


def _estimate(config) -> str:
    """`` (about 4m27s on a quiet 2-core CPU)`` by the recipe's expected rate, or nothing."""
    if config.steps is None or not config.expected_steps_per_s:
        return ""
    from nearsight.core.progress import format_duration

    seconds = config.steps / config.expected_steps_per_s
    return f" (about {format_duration(seconds)} on a quiet 2-core CPU)"


def run_demo(args: argparse.Namespace) -> int:
    import importlib.util

    for module in ("torch", "torchvision", "onnx"):  # before minutes of making the dataset
        if importlib.util.find_spec(module) is None:
            raise NearsightError(
                f"demo trains a model: {module} is not installed; it comes with nearsight's "
                "[train] extra: pip install 'nearsight[train]'"
            )
    work: Path = args.workdir
    data = work / "data"
    config = demo_config(args, data)  # bad options fail before anything is written
    if work.exists() and not work.is_dir():
        raise NearsightError(f"--workdir {work} is a file, not a folder")
    try:
        work.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a file where a parent folder should be, no permission
        raise NearsightError(f"cannot create --workdir {work}: {error.strerror}") from None
    loss = config.loss.name
    run = work / f"run-{loss}"
    untrained_checkpoint = run / "untrained.pt"
    models = {
        "untrained": work / "model-untrained.onnx",
        "trained": work / f"model-{loss}.onnx",
    }
    galleries = {"untrained": work / "gallery-untrained", "trained": work / f"gallery-{loss}"}
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
    length = _length(config)
    finished = [run / DONE_MARKER, run / "last.pt", untrained_checkpoint]
    if all(path.exists() for path in finished) and _done_length(run) == length:
        print(f"[2/{total}] training: reusing {run}")
    else:
        if run.exists():
            print(f"[2/{total}] {run} holds an unfinished or other run: starting it again")
            shutil.rmtree(run)
        start_point = "from scratch" if config.model.pretrained == "none" else "ImageNet weights"
        _step(
            2,
            total,
            f"training ResNet-50 with the {loss} loss for {length}{_estimate(config)} at "
            f"{config.data.image_size} px ({start_point})",
            lambda: _train(config, run, untrained_checkpoint),
        )
        (run / DONE_MARKER).write_text(json.dumps({"loss": loss, "length": length}))

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
                functools.partial(export_onnx, checkpoints[name], models[name]),
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
                functools.partial(_build_gallery, models[name], data, gallery, config.data.workers),
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
    from nearsight.app.server_app import serve

    serve(Settings(galleries=[galleries["trained"], galleries["untrained"]], host=args.host,
                   port=args.port))  # fmt: skip
    return 0


def _done_length(run: Path) -> str | None:
    """How long the finished run in ``run`` trained (as ``_length`` says it)."""
    try:
        return json.loads((run / DONE_MARKER).read_text()).get("length")
    except (OSError, ValueError, AttributeError):
        return None


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
