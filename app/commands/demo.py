"""``nearsight demo``: the whole pipeline on the embedded synthetic dataset, in one command.

data synth -> train (briefly, a seed loss) -> export ONNX -> index build (the unseen test
classes) -> eval -> serve. Each step says what it does and how long it took; a finished step
is reused, so a second run opens the page in seconds. Every step is the same code path as its
own subcommand.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nearsight.models.errors import NearsightError

DONE_MARKER = "demo-done.json"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the whole pipeline on the synthetic dataset and open the page",
        description="Generate the synthetic dataset, train the ResNet-50 embedding briefly with "
        "a seed loss, export it to ONNX, index the unseen test classes, print Recall@k of the "
        "trained network beside the untrained one's, and serve the page. Finished steps in "
        "--workdir are reused.",
    )
    parser.add_argument("--workdir", type=Path, default=Path("runs/demo"))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument(
        "--no-launch", action="store_true", help="stop after the gallery and print its Recall@k"
    )
    parser.add_argument("--loss", default="ice", help="seed loss to train with (default ice)")
    parser.add_argument(
        "--train-seconds", type=float, default=150.0, help="training time (default 150)"
    )
    parser.add_argument("--steps", type=int, help="train this many steps instead of by time")
    parser.add_argument("--image-size", type=int, default=64, help="training crop (default 64)")
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


class _StepFailed(Exception):
    """A step's subcommand failed; it has already printed its one-line error."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def _call(argv: list[str]) -> None:
    from nearsight.app.cli import main

    code = main(argv)
    if code:
        raise _StepFailed(code)


def _pretrained() -> tuple[str, dict[str, Any]]:
    """ImageNet weights when torchvision's cache has them; otherwise from scratch, where
    BatchNorm must learn its statistics and the trunk needs the head's learning rate."""
    from nearsight.models.weights import imagenet_cache_path

    if imagenet_cache_path("resnet50", "imagenet").exists():
        return "imagenet", {"model.freeze_bn": True, "optim.lr": 1e-4, "optim.head_lr": 1e-3}
    return "none", {"model.freeze_bn": False, "optim.lr": 1e-3, "optim.head_lr": 1e-3}


def run_demo(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except _StepFailed as failed:
        return failed.code


def _run(args: argparse.Namespace) -> int:
    work: Path = args.workdir
    if work.exists() and not work.is_dir():
        raise NearsightError(f"--workdir {work} is a file, not a folder")
    try:
        work.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a file where a parent folder should be, no permission
        raise NearsightError(f"cannot create --workdir {work}: {error.strerror}") from None
    data = work / "data"
    run = work / f"run-{args.loss}"
    model = work / f"model-{args.loss}.onnx"
    gallery = work / f"gallery-{args.loss}"
    total = 5 if args.no_launch else 6
    started = time.perf_counter()

    # 1. data
    if (data / "synthetic.json").exists():
        print(f"[1/{total}] synthetic dataset: reusing {data}")
    else:
        _step(
            1,
            total,
            f"generating the synthetic dataset ({args.classes} classes x {args.per_class} images)",
            lambda: _call(
                [
                    "data",
                    "synth",
                    "--out",
                    str(data),
                    "--classes",
                    str(args.classes),
                    "--per-class",
                    str(args.per_class),
                    "--size",
                    str(args.synth_size),
                ]
            ),
        )

    # 2. train
    if (run / DONE_MARKER).exists() and (run / "best.pt").exists():
        print(f"[2/{total}] training: reusing {run}")
    else:
        if run.exists():
            print(f"[2/{total}] {run} holds an unfinished run: starting it again")
            shutil.rmtree(run)
        pretrained, settings = _pretrained()
        length = (
            ["--steps", str(args.steps)]
            if args.steps
            else ["--steps", "1000000", "--time-limit", str(args.train_seconds)]
        )
        argv = [
            "train",
            "--dataset",
            "folder",
            "--root",
            str(data),
            "--loss",
            args.loss,
            "--out",
            str(run),
            "--image-size",
            str(args.image_size),
            "--pretrained",
            pretrained,
            "--classes-per-batch",
            str(min(8, args.classes // 2)),
            "--per-class",
            "4",
            "--workers",
            str(args.workers),
            # from scratch at the demo's rates, Recall@1 peaks near step 150 and then falls
            # (0.120 at step 150, 0.051 at 256): evaluating every 100 steps keeps the best
            # checkpoint, so a longer --train-seconds never exports a worse model
            "--eval-every",
            "100",
            "--set",
            "eval_at_start=true",
            *length,
        ]
        for key, value in settings.items():
            argv += ["--set", f"{key}={value}"]
        how_long = f"{args.steps} steps" if args.steps else f"{args.train_seconds:g}s"
        _step(
            2,
            total,
            f"training ResNet-50 with the {args.loss} loss for {how_long} at "
            f"{args.image_size} px ({'ImageNet weights' if pretrained != 'none' else 'from scratch'})",
            lambda: _call(argv),
        )
        (run / DONE_MARKER).write_text(json.dumps({"loss": args.loss}))

    # 3. export
    best = run / "best.pt"
    if model.exists() and model.stat().st_mtime >= best.stat().st_mtime:
        print(f"[3/{total}] ONNX model: reusing {model}")
    else:
        _step(
            3,
            total,
            f"exporting {best} to ONNX",
            lambda: _call(["export", "--checkpoint", str(best), "--out", str(model)]),
        )

    # 4. gallery
    if _gallery_matches(gallery, model):
        print(f"[4/{total}] gallery: reusing {gallery}")
    else:
        _step(
            4,
            total,
            "indexing the unseen test classes",
            lambda: _call(
                [
                    "index",
                    "build",
                    "--model",
                    str(model),
                    "--dataset",
                    "folder",
                    "--root",
                    str(data),
                    "--split",
                    "test",
                    "--out",
                    str(gallery),
                    "--workers",
                    str(args.workers),
                ]
            ),
        )

    # 5. eval: trained (the gallery, leave-one-out) beside untrained (step 0, same images)
    trained = _step(5, total, "evaluating the gallery", lambda: _gallery_metrics(gallery))
    untrained = _untrained_metrics(run)
    _print_comparison(trained, untrained)
    print(f"demo ready in {time.perf_counter() - started:.0f}s: gallery {gallery}, model {model}")
    if args.no_launch:
        return 0

    # 6. the page
    print(f"[6/{total}] serving the page (Ctrl-C to stop)")
    _call(
        [
            "serve",
            "--gallery",
            str(gallery),
            "--model",
            str(model),
            "--host",
            args.host,
            "--port",
            str(args.port),
        ]
    )
    return 0


def _gallery_matches(gallery: Path, model: Path) -> bool:
    if not (gallery / "catalog.db").exists() or not model.exists():
        return False
    from nearsight.index.gallery import Gallery
    from nearsight.models.embedder import load_embedder

    try:
        Gallery.open(gallery, model=load_embedder(model, device="cpu")).close()
    except NearsightError:
        return False
    return True


def _gallery_metrics(gallery: Path) -> dict[str, Any]:
    from nearsight.index.gallery import Gallery

    opened = Gallery.open(gallery)
    try:
        return opened.evaluate()
    finally:
        opened.close()


def _untrained_metrics(run: Path) -> dict[str, Any] | None:
    path = run / "metrics.jsonl"
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record.get("step") == 0:
            return record
    return None


def _print_comparison(trained: dict[str, Any], untrained: dict[str, Any] | None) -> None:
    keys = [k for k in trained if k.startswith("recall@")] + ["nmi", "map@r"]
    print(f"\ntest classes, {trained['queries']} queries (leave-one-out)")
    print(f"{'metric':<12}{'untrained':>11}{'trained':>10}")
    for key in keys:
        before = f"{untrained[key]:.4f}" if untrained and key in untrained else "-"
        print(f"{key:<12}{before:>11}{trained[key]:>10.4f}")
    print()
