"""Plain helpers shared by the test files: builders of small data, models and galleries, the
in-process CLI runner, assertions. No fixtures here (they live in conftest.py, and call these);
test files import what they need: ``from helpers import run, FAST``."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]

ONNX_CLASSES, ONNX_PER_CLASS, ONNX_SIZE, ONNX_DIM = 4, 3, 32, 8


@dataclass
class OnnxGallery:
    data: Path  # the image folder (class folders)
    checkpoint: Path
    model: Path  # model.onnx exported from ``checkpoint``
    gallery: Path  # built from ``data`` with ``model``
    query: Path  # one of the gallery's images


def make_onnx_gallery(root: Path, seed: int = 0) -> OnnxGallery:
    """A random resnet18 (8-d, 32 px) exported to ONNX and a gallery of 4 x 3 synthetic images
    built with it by the CLI."""
    import torch

    from nearsight.app.cli import main
    from nearsight.data.datasets.synthetic import write_synthetic
    from nearsight.models.checkpoint import save_checkpoint
    from nearsight.models.embedding import EmbeddingConfig, build_embedding_net
    from nearsight.models.export import export_onnx

    data = root / "data"
    write_synthetic(data, classes=ONNX_CLASSES, per_class=ONNX_PER_CLASS, size=ONNX_SIZE)
    torch.manual_seed(seed)
    checkpoint = root / "model.pt"
    config = EmbeddingConfig(dim=ONNX_DIM, image_size=ONNX_SIZE, arch="resnet18")
    save_checkpoint(checkpoint, build_embedding_net(config))
    model = root / "model.onnx"
    export_onnx(checkpoint, model)
    gallery = root / "gallery"
    argv = ["index", "build", "--model", str(model), "--dataset", "folder", "--root", str(data)]
    assert main([*argv, "--split", "all", "--out", str(gallery), "--workers", "0"]) == 0
    query = next(path for path in sorted(data.rglob("*.png")))
    return OnnxGallery(data, checkpoint, model, gallery, query)


def write_digits(root: Path, *, size: int = 32, test_per_class: int | None = None) -> Path:
    """scikit-learn's bundled handwritten digits (8x8, 10 classes; nothing downloaded) as RGB
    PNGs upscaled to ``size`` px in an image folder (``ROOT/digit_K/NNNN.png``): the folder
    loader splits it class-disjointly, digits 0-4 train and 5-9 test, the test classes cut to
    their first ``test_per_class`` images when given. Returns ``root``."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    kept = {digit: 0 for digit in range(10)}
    for number, (pixels, digit) in enumerate(zip(digits.images, digits.target, strict=True)):
        kept[digit] += 1
        if digit >= 5 and test_per_class is not None and kept[digit] > test_per_class:
            continue
        folder = root / f"digit_{digit}"
        folder.mkdir(parents=True, exist_ok=True)
        grey = Image.fromarray(np.uint8(np.round(pixels * 255 / 16)), mode="L")
        grey = grey.resize((size, size), Image.Resampling.BILINEAR)
        grey.convert("RGB").save(folder / f"{number:04d}.png")
    return root


def build_wheel(out: Path) -> Path:
    """`pip wheel` of a copy of the checkout (the build writes build/ and egg-info into the
    source folder, so not into the checkout); returns the wheel's path."""
    source = out / "source"
    anywhere = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.onnx")
    top_only = {".venv", ".git", "build", "dist", ".pytest_cache", ".ruff_cache", "runs", "data",
                "test-artifacts", ".whl"}  # fmt: skip

    def skip(folder: str, names: list[str]) -> set[str]:
        # runs/ and data/ at the top are a user's; nearsight/data/ is a package
        return anywhere(folder, names) | (top_only & set(names) if Path(folder) == ROOT else set())

    shutil.copytree(ROOT, source, ignore=skip)
    wheels = out / "wheels"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--quiet", "-w", str(wheels), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = wheels.glob("nearsight-*.whl")
    return wheel


class TrainingCrash(Exception):
    """Raised inside a training step to stand in for a crash (a kill mid-run)."""


def train_one_and_two_processes(args: list[str], out: Path) -> tuple[Path, Path]:
    """``nearsight train *args`` once in one process and once under torchrun with 2 CPU
    processes (gloo), one thread each; returns the two run folders (OUT/single, OUT/ddp)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # fp32: the comparison is of DDP's arithmetic, where the two runs agree to float rounding
    # (bf16 autocast, the default on CPUs with native bf16, rounds the two batch splits apart)
    args = [*args, "--set", "amp=false", "--set", "channels_last=false"]
    single, ddp = out / "single", out / "ddp"
    subprocess.run(
        [sys.executable, "-m", "nearsight.app.cli", "train", *args, "--out", str(single)],
        check=True,
        env=env,
        capture_output=True,
    )
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    result = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node", "2", "-m", "nearsight.app.cli", "train",
         *args, "--out", str(ddp)],
        env=env,
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return single, ddp


def crash_training(config, out_dir: Path, monkeypatch, *, in_step: int) -> None:
    """Run ``train(config, out_dir)`` and crash it inside the ``in_step``-th training step,
    after the earlier steps were done and saved; the trainer is whole again afterwards."""
    from nearsight.training.run import train
    from nearsight.training.trainer import Trainer

    original = Trainer._train_step
    calls = {"n": 0}

    def dying_step(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == in_step:
            raise TrainingCrash
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "_train_step", dying_step)
    with pytest.raises(TrainingCrash):
        train(config, out_dir)
    monkeypatch.setattr(Trainer, "_train_step", original)


@contextlib.contextmanager
def running_page(galleries: list[Path], *, analyse: bool = True, **options):
    """The page and its REST API served on a free port for a test: yields (url, app), then
    stops the server, the API's batcher and the page's analysis threads. ``analyse``: wait for
    the galleries' analysis first (False: start none); ``options`` go to ``launch_app``."""
    from nearsight.app.page.layout import build_app
    from nearsight.app.serve.server import launch_app, stop_app

    demo = build_app(galleries, device="cpu", analyse=analyse)
    url = launch_app(demo, port=free_port(), prevent_thread_lock=True, quiet=True, **options)
    try:
        if analyse:
            assert demo.nearsight.wait_analysis(timeout=120)
        yield url, demo
    finally:
        stop_app(demo)


def stop_process(process: subprocess.Popen, timeout: float = 30) -> int:
    """Stop a process a test started, and wait for it: SIGTERM, then SIGKILL if it has not
    exited ``timeout`` s later. Returns its exit code (``-signal.SIGKILL`` when it had to be
    killed). Never SIGINT: a job started with ``&`` (``nohup make test &``) ignores SIGINT, and
    so does every process it starts."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


@contextlib.contextmanager
def started(argv: list, *, timeout: float = 30, **popen: Any) -> Iterator[subprocess.Popen]:
    """``subprocess.Popen(argv, **popen)`` for the block; however the block ends, the process
    is stopped with :func:`stop_process` (a test that kills it itself leaves nothing to do)."""
    process = subprocess.Popen([str(arg) for arg in argv], **popen)
    try:
        yield process
    finally:
        stop_process(process, timeout)


@contextlib.contextmanager
def serve_process(args: list, *, env: dict | None = None, stderr: Any = subprocess.DEVNULL):
    """``nearsight serve ARGS`` in a process of its own on a free port of 127.0.0.1, once its
    ``/api/health`` answers (at most 120 s): yields (url, process), then stops it
    (:func:`stop_process`)."""
    import httpx

    port = free_port()
    argv = [sys.executable, "-m", "nearsight.app.cli", "serve", "--port", port,
            "--analysis-max-items", "0", *args]  # fmt: skip
    env = {**os.environ, **(env or {})}
    with started(argv, env=env, stdout=subprocess.DEVNULL, stderr=stderr, text=True) as process:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/api/health", timeout=1).status_code == 200:
                    break
            assert process.poll() is None, "the server exited"
            time.sleep(0.2)
        yield url, process


def process_mb(pid: int, field: str = "VmRSS") -> float:
    """A process's resident memory now (VmRSS) or at its peak (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


# -- tiny galleries built by the CLI ----------------------------------------------------------

FAST = ["--workers", "0"]
CLASSES = 6
PER_CLASS = 4
SHOPS = ("north", "south")


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def tiny_model(path: Path, seed: int, dim: int = 16) -> Path:
    """A random resnet18 checkpoint, ``dim``-d at 32 px."""
    import torch

    from nearsight.models.checkpoint import save_checkpoint
    from nearsight.models.embedding import EmbeddingConfig, EmbeddingNet

    torch.manual_seed(seed)
    config = EmbeddingConfig(dim=dim, image_size=32, arch="resnet18", pretrained="none")
    return save_checkpoint(path, EmbeddingNet(config))


def run(capsys, *argv) -> tuple[int, str, str]:
    """``nearsight *argv`` in this process: (exit code, stdout, stderr)."""
    from nearsight.app.cli import main

    code = main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def cli_argv(*argv) -> list[str]:
    """``nearsight *argv`` as a command line for another process (subprocess.run, Popen)."""
    return [sys.executable, "-m", "nearsight.app.cli", *[str(arg) for arg in argv]]


def assert_one_line_error(code: int, err: str, *fragments: str) -> str:
    """Exit 2, no traceback, ONE ``nearsight: error:`` line holding every fragment; returns
    that line."""
    assert code == 2, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("nearsight: error:")]
    assert len(lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSON-lines file (metrics.jsonl, train.jsonl), blank lines skipped."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def make_staged_gallery(root: Path, model: Path) -> dict:
    """A gallery of 4 synthetic test classes built with ``model`` (the session's ONNX one),
    a layer3 re-ranker trained for it on the 4 train classes (rerank train --stage layer3),
    and the gallery's stored layer3 features (rerank features); ``query``: a train-split
    image, so not any item's file. ``spec`` re-ranks with ``shuffler``, a layer3 re-ranker of
    random weights: two epochs on 16 images learn to keep the base order, a random one
    re-orders by the features it is given, so a test of which features reach it can fail."""
    from nearsight.app.cli import main
    from nearsight.data.datasets.synthetic import write_synthetic
    from nearsight.models.embedder import file_sha256
    from nearsight.training.pairwise import export_scorer

    data = root / "data"
    write_synthetic(data, classes=8, per_class=4, size=32, seed=3)
    gallery = root / "gallery"
    build = ["index", "build", "--model", str(model), "--dataset", "folder"]
    assert main([*build, "--root", str(data), "--split", "test", "--out", str(gallery)]) == 0
    out = root / "staged.onnx"
    argv = ["rerank", "train", "--model", str(model), "--dataset", "folder", "--root", str(data),
            "--out", str(out), "--depth", "4", "--epochs", "2", "--stage", "layer3", "--json"]
    assert main(argv) == 0
    assert main(["rerank", "features", "--gallery", str(gallery), "--stage", "layer3"]) == 0
    shuffler = root / "shuffler.onnx"
    export_scorer(random_stage_scorer(out, seed=0), shuffler, file_sha256(model),
                  {"side_stage": "layer3"})  # fmt: skip
    queries = sorted((data / "train").rglob("*.png"))  # the gallery holds the test split
    return {"data": data, "gallery": gallery, "reranker": out, "model": model,
            "shuffler": shuffler, "spec": f"pairwise:model={shuffler},depth=4",
            "trained_spec": f"pairwise:model={out},depth=4", "query": queries[0],
            "queries": queries}  # fmt: skip


def random_stage_scorer(like: Path, seed: int):
    """A stage PairScorer of the width of re-ranker file ``like``, its MLP's weights random
    (an untrained one keeps the base order: its last layer starts at zero)."""
    import torch

    from nearsight.search.rerank.pairwise import PairwiseReranker
    from nearsight.training.pairwise import PairScorer

    opened = PairwiseReranker(like)
    torch.manual_seed(seed)
    scorer = PairScorer(opened.dim, elementwise=False, side_dim=opened.side_dim)
    for parameter in scorer.mlp.parameters():
        torch.nn.init.normal_(parameter, std=1.0)
    return scorer.eval()


@dataclass
class TinyGallery:
    root: Path
    data: Path
    model: Path
    gallery: Path
    secret: Path  # a file outside every gallery folder
    link: Path  # a symlink inside a gallery image folder pointing at ``secret``
    items: list[dict]


def make_tiny_gallery(root: Path, arch: str = "resnet50", seed: int = 2) -> TinyGallery:
    """6 classes x 4 images of 32 px, a random 16-d network and its gallery (built by the CLI).

    Seed 2: the random ResNet-50 gets 4 of the 24 rank-1 neighbours right, so the page shows
    both kinds (seed 0 got none right)."""
    import torch

    from nearsight.app.cli import main
    from nearsight.data.datasets.synthetic import write_synthetic
    from nearsight.index.gallery.core import Gallery
    from nearsight.models.checkpoint import save_checkpoint
    from nearsight.models.embedding import EmbeddingConfig, build_embedding_net

    data = root / "data"
    write_synthetic(data, classes=CLASSES, per_class=PER_CLASS, size=32)
    torch.manual_seed(seed)
    model = root / "model.pt"
    config = EmbeddingConfig(dim=16, image_size=32, arch=arch)
    save_checkpoint(model, build_embedding_net(config))
    gallery = root / "gallery"
    argv = ["index", "build", "--model", str(model), "--dataset", "folder", "--root", str(data)]
    assert main([*argv, "--split", "all", "--out", str(gallery), "--workers", "0"]) == 0
    with Gallery.open(gallery) as opened:
        items = opened.all_items()
    secret = root / "secret.txt"
    secret.write_text("top secret: not an image of any gallery\n")
    link = Path(items[0]["path"]).parent / "link-to-secret.png"
    link.symlink_to(secret)
    return TinyGallery(root, data, model, gallery, secret, link, items)


def make_product(root: Path) -> dict:
    """A CSV manifest with shop, price and sku columns over a synthetic folder dataset (6 x 6
    images of 32 px, all in the test split) and its gallery, built by the CLI with a random
    16-d resnet18: {"root", "images", "gallery", "model"}."""
    import csv

    from nearsight.app.cli import main
    from nearsight.data.datasets.synthetic import write_synthetic

    write_synthetic(root / "data", classes=6, per_class=6, size=32)
    images = sorted(p for p in (root / "data").rglob("*.png"))
    manifest = root / "data" / "products.csv"
    with open(manifest, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "label", "split", "shop", "price", "sku"])
        for number, image in enumerate(images):
            writer.writerow(
                [
                    image.relative_to(manifest.parent),
                    image.parent.name,
                    "test",
                    SHOPS[number % 2],
                    f"{number * 1.5:.1f}",
                    f"{number:04d}",
                ]
            )
    model = tiny_model(root / "model.pt", seed=0)
    gallery = root / "gallery"
    code = main(["index", "build", "--model", str(model), "--dataset", "csv", "--root",
                 str(manifest), "--out", str(gallery), *FAST])  # fmt: skip
    assert code == 0
    return {"root": root, "images": images, "gallery": gallery, "model": model}


SHOP_NAMES = ("Café", "Bäckerei", "north")
SHOP_SINCE = "2025-06-01"


def make_shop(root: Path) -> dict:
    """A shop's catalog: a CSV with ``added`` (ISO dates, half of them on or after
    :data:`SHOP_SINCE`), ``colour``, ``name`` (unicode), ``price``, ``shop`` (unicode) and
    ``sku`` (the key column, zero-padded, the last column by name; ``colour`` is blank on
    every 7th row) over a synthetic folder dataset (6 x 6 images of 32 px), built by the CLI
    with ``--key-column sku``: {"root", "images", "gallery", "model", "rows"} (rows: the
    CSV's dicts)."""
    import csv
    import datetime as dt

    from nearsight.app.cli import main
    from nearsight.data.datasets.synthetic import write_synthetic

    write_synthetic(root / "data", classes=6, per_class=6, size=32)
    images = sorted(p for p in (root / "data").rglob("*.png"))
    manifest = root / "data" / "shop.csv"
    rows = []
    for number, image in enumerate(images):
        added = dt.date(2025, 4, 1) + dt.timedelta(days=5 * number)
        rows.append({
            "path": str(image.relative_to(manifest.parent)), "label": image.parent.name,
            "split": "test", "added": added.isoformat(),
            "colour": "" if number % 7 == 0 else ("red", "green", "blue")[number % 3],
            "name": f"Müsli {number}",
            "price": f"{number * 1.5:.2f}", "shop": SHOP_NAMES[number % 3],
            "sku": f"{number:05d}",
        })  # fmt: skip
    with open(manifest, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    model = tiny_model(root / "model.pt", seed=0)
    gallery = root / "gallery"
    code = main(["index", "build", "--model", str(model), "--dataset", "csv", "--root",
                 str(manifest), "--out", str(gallery), "--key-column", "sku", *FAST])  # fmt: skip
    assert code == 0
    return {"root": root, "images": images, "gallery": gallery, "model": model, "rows": rows}


# -- the page in Debian's chromium ----------------------------------------------------------

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 60_000  # the 2-core test machine is shared: be patient, not flaky


def upload(page, path: Path | str) -> None:
    page.set_input_files("#ns-query-image input[type=file]", str(path))


# -- loss tests: random batches, autograd, and the checks every seed loss passes ----------------


def random_batch(n: int, dim: int, classes: int, seed: int) -> tuple[Any, Any]:
    """``n`` unit float64 embeddings of ``dim`` and shuffled labels of ``classes`` classes."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    emb = torch.randn(n, dim, generator=generator, dtype=torch.float64)
    emb = torch.nn.functional.normalize(emb, dim=1)
    labels = torch.arange(n) % classes
    labels = labels[torch.randperm(n, generator=generator)]
    return emb, labels


def autograd(loss_fn, emb, labels):
    """(loss value, its gradient with respect to ``emb``)."""
    import torch

    emb = emb.clone().requires_grad_(True)
    value = loss_fn(emb, labels)
    (grad,) = torch.autograd.grad(value, emb)
    return value, grad


def count_python_calls(fn) -> int:
    """Python function calls made while ``fn()`` runs."""
    calls = 0

    def profiler(frame, event, arg):
        nonlocal calls
        if event == "call":
            calls += 1

    sys.setprofile(profiler)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def assert_no_python_loop_over_anchors(loss) -> None:
    """Whole-batch tensor code: a batch 10x larger makes no more Python calls."""
    counts = []
    for n in (16, 160):
        emb, labels = random_batch(n, 8, n // 4, seed=0)
        emb.requires_grad_(True)
        loss(emb, labels)  # warm-up: lazy imports happen once
        counts.append(count_python_calls(lambda emb=emb, labels=labels: loss(emb, labels)))
    assert counts[0] == counts[1], counts


def assert_float32_agrees_with_float64(loss) -> None:
    """Training runs in float32: the same batch gives the same loss and gradient."""
    import torch

    emb, labels = random_batch(24, 16, 6, seed=21)
    value64, grad64 = autograd(loss, emb, labels)
    value32, grad32 = autograd(loss, emb.float(), labels)
    assert value32.dtype == torch.float32 and grad32.dtype == torch.float32
    assert value32.item() == pytest.approx(value64.item(), rel=1e-4)
    torch.testing.assert_close(grad32.double(), grad64, rtol=1e-3, atol=1e-5)


# -- timm trunks: tiny random models and a Hugging Face hub cache made on disk -------------------

TIMM_VIT, TIMM_CONVNEXT, TIMM_RESNET = "timm:test_vit", "timm:test_convnext", "timm:test_resnet"


def write_hub_weights(
    cache: Path, repo_id: str, state_dict: dict, revision: str = "0" * 40
) -> Path:
    """``state_dict`` saved as the hub's ``model.safetensors`` of ``repo_id`` in ``cache``, in
    the layout huggingface_hub writes: the file in ``blobs/``, linked from
    ``snapshots/REVISION/``, and ``refs/main`` naming the revision. Returns the snapshot path."""
    import hashlib

    from safetensors.torch import save_file

    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    staged = repo / "blobs" / "staged"
    save_file({key: value.contiguous() for key, value in state_dict.items()}, str(staged))
    blob = repo / "blobs" / hashlib.sha256(staged.read_bytes()).hexdigest()
    staged.rename(blob)
    snapshot = repo / "snapshots" / revision / "model.safetensors"
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    snapshot.symlink_to(os.path.relpath(blob, snapshot.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot


# -- tag bombs: small files whose metadata tags all point at one large region --------------------


def _bomb_tags(count: int, skip: frozenset[int]) -> list[int]:
    """``count`` tag numbers Pillow gives no meaning to (so it only copies their data)."""
    from PIL import TiffTags

    # (and 0xBC01, which makes Pillow refuse the file as JPEG XR)
    known = set(TiffTags.TAGS_V2) | set(TiffTags.TAGS) | set(skip) | {34665, 34853, 40965, 0xBC01}
    tags = [tag for tag in range(1, 65536) if tag not in known][:count]
    assert len(tags) == count, f"only {len(tags)} free tag numbers"
    return tags


def _ifd(entries: list[tuple[int, int, int, int]], at: int) -> bytes:
    """A little-endian TIFF IFD of (tag, type, count, value-or-offset) at offset ``at``."""
    import struct

    body = struct.pack("<H", len(entries))
    body += b"".join(struct.pack("<HHII", *entry) for entry in sorted(entries))
    return body + struct.pack("<I", 0)


def exif_tag_bomb(tags: int, region_bytes: int) -> bytes:
    """An EXIF blob (a little-endian TIFF structure) whose ``tags`` UNDEFINED tags all point at
    one ``region_bytes`` region: Pillow reads (copies) the region once per tag. A
    ``region_bytes`` of 0 makes the region the whole blob (the tags' own table included), for
    a JPEG's 64 KB APP1 segment."""
    numbers = _bomb_tags(tags, frozenset())
    table = 8 + 2 + 12 * tags + 4
    if region_bytes:
        entries = [(tag, 7, region_bytes, table) for tag in numbers]
        return b"II*\x00" + (8).to_bytes(4, "little") + _ifd(entries, 8) + bytes(region_bytes)
    # each tag: the whole blob but its first two bytes (a read of all of a BytesIO from 0
    # would return the blob itself, uncopied)
    entries = [(tag, 7, table - 2, 2) for tag in numbers]
    return b"II*\x00" + (8).to_bytes(4, "little") + _ifd(entries, 8)


def tiff_tag_bomb(tags: int, region_bytes: int) -> bytes:
    """A valid 1x1 grayscale TIFF whose IFD also holds ``tags`` tags pointing at one
    ``region_bytes`` region (read by ``Image.open``, and again by ``getexif``)."""
    image_tags = frozenset({256, 257, 258, 259, 262, 273, 277, 278, 279})
    numbers = _bomb_tags(tags, image_tags)
    table = 8 + 2 + 12 * (tags + len(image_tags)) + 4
    pixel = table
    region = table + 1
    entries = [
        (256, 3, 1, 1), (257, 3, 1, 1), (258, 3, 1, 8), (259, 3, 1, 1), (262, 3, 1, 1),
        (273, 4, 1, pixel), (277, 3, 1, 1), (278, 3, 1, 1), (279, 4, 1, 1),
    ]  # fmt: skip
    entries += [(tag, 7, region_bytes, region) for tag in numbers]
    head = b"II*\x00" + (8).to_bytes(4, "little") + _ifd(entries, 8)
    return head + b"\x80" + bytes(region_bytes)


def tag_bomb(kind: str, tags: int, region_bytes: int) -> bytes:
    """A 1x1 image of ``kind`` (tiff, png, webp, jpeg) whose EXIF/TIFF tags repeat one region
    (a JPEG's EXIF segment holds 64 KB at most: its tags point at the whole segment)."""
    import io

    from PIL import Image

    if kind == "tiff":
        return tiff_tag_bomb(tags, region_bytes)
    exif = exif_tag_bomb(tags, 0 if kind == "jpeg" else region_bytes)
    if kind == "jpeg":  # the APP1 segment starts with its name
        exif = b"Exif\x00\x00" + exif
    out = io.BytesIO()
    options = {"lossless": True} if kind == "webp" else {}
    Image.new("RGB", (1, 1), (200, 30, 30)).save(out, format=kind.upper(), exif=exif, **options)
    return out.getvalue()


def jpeg_scan_bomb(side: int, copies: int) -> bytes:
    """A valid progressive gray ``side`` x ``side`` JPEG whose second scan (an AC scan of a flat
    image: ~30 bytes) is repeated ``copies`` more times: each repeat makes the decoder visit
    every block again (libjpeg only warns), so a file of a few hundred KB costs minutes of CPU."""
    import io
    import struct

    from PIL import Image

    out = io.BytesIO()
    Image.new("L", (side, side), 128).save(out, format="JPEG", progressive=True, quality=90)
    data = out.getvalue()
    scans, pos = [], 2
    while data[pos + 1] != 0xD9:  # each marker segment up to the end of the image
        end = pos + 2 + struct.unpack(">H", data[pos + 2 : pos + 4])[0]
        if data[pos + 1] == 0xDA:  # a scan: its entropy-coded data runs to the next marker
            while data[(end := data.index(b"\xff", end)) + 1] == 0 or 0xD0 <= data[end + 1] <= 0xD7:
                end += 2
            scans.append((pos, end))
        pos = end
    start, end = scans[1]
    return data[:end] + data[start:end] * copies + data[end:]
