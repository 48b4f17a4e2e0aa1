"""Wall time and peak memory of ONE `nearsight search` of an ONNX gallery, as a user runs it.

    python bench/cli_search.py [--items 1200] [--dim 128] [--image-size 224] [--repeats 5]
                               [--workdir DIR] [--json FILE]

Setup (not measured): a random 224-px ResNet-50 embedding net exported to ONNX, and a gallery
of ``--items`` random unit vectors (the model's sha256 recorded, so that the search checks it)
whose items point at a few real image files; the query is one of those files.

Measured, each in a fresh interpreter, ``--repeats`` times (the median is reported): the
command ``python -m nearsight.app.cli search --gallery G QUERY --json`` from process start to
exit, wall time, CPU time and the child's peak RSS (``os.wait4``'s rusage).

- ``after``: the command as it is;
- ``before`` (the peer, same run, same machine): the same command in an interpreter that first
  imports what the serving path loaded before this round (torch, torchvision, scikit-learn,
  scipy, pandas, pytorch-metric-learning), i.e. the cost those imports added to every search.

Goal (issue 15): ``after`` at most 1.5 s wall and 400 MB peak on the 2-core CPU machine. The
machine may be shared: the load average is printed with the numbers. A script, not a test.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

GOAL_WALL_S = 1.5
GOAL_PEAK_MB = 400.0
HEAVY = "import torch, torchvision, sklearn, scipy, pandas, pytorch_metric_learning"
RUN_CLI = "import sys; from nearsight.app.cli import main; sys.exit(main(sys.argv[1:]))"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=1200)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workdir", type=Path, help="keep the model and gallery here")
    parser.add_argument("--json", type=Path, help="also write the results here")
    return parser.parse_args(argv)


def make_model(workdir: Path, dim: int, image_size: int) -> Path:
    model = workdir / "model.onnx"
    if model.exists():
        return model
    import torch

    from nearsight.models.checkpoint import save_checkpoint
    from nearsight.models.embedding import EmbeddingConfig, build_embedding_net
    from nearsight.models.export import export

    torch.manual_seed(0)
    net = build_embedding_net(EmbeddingConfig(dim=dim, image_size=image_size))
    save_checkpoint(workdir / "model.pt", net)
    export(workdir / "model.pt", model)
    return model


def make_gallery(workdir: Path, model: Path, items: int) -> tuple[Path, Path]:
    from nearsight.data.datasets.synthetic import write_synthetic
    from nearsight.data.images import describe_image_file
    from nearsight.index.gallery.write import write_gallery
    from nearsight.models.loading import load_embedder

    images_dir = workdir / "images"
    if not images_dir.exists():
        write_synthetic(images_dir, classes=4, per_class=4, size=320)
    images = sorted(images_dir.rglob("*.png"))
    gallery = workdir / f"gallery-{items}"
    if (gallery / "catalog.db").exists():
        return gallery, images[0]
    embedder = load_embedder(model, device="cpu")
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((items, embedder.dim), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    described = [describe_image_file(path) for path in images]
    rows = [
        {
            "path": str(images[i % len(images)]),
            "label": i % 100,
            "class_name": f"class {i % 100:03d}",
            "split": "test",
            **described[i % len(images)],
        }
        for i in range(items)
    ]
    write_gallery(
        gallery,
        vectors,
        rows,
        model_sha256=embedder.model_sha256,
        meta={"model": str(model), "model_spec": embedder.spec.to_dict(), "source": "bench"},
    )
    return gallery, images[0]


def measure(command: list[str]) -> tuple[float, float, float]:
    """(wall seconds, peak RSS in MB, CPU seconds) of one run of ``command``, which must
    succeed. CPU time (user + system, all threads) moves less than wall time on a busy
    machine."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    error = process.stderr.read().decode() if process.stderr else ""
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed: {error[-1000:]}")
    return wall, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime  # maxrss: kB


def prepare(workdir: Path, dim: int, image_size: int, items: int) -> None:
    make_gallery(workdir, make_model(workdir, dim, image_size), items)


def run(args: argparse.Namespace, workdir: Path) -> dict:
    # Made in a spawned process: on Linux a forked child's peak RSS starts from its parent's,
    # so a parent that had loaded torch would inflate every measured search.
    context = multiprocessing.get_context("spawn")
    maker = context.Process(target=prepare, args=(workdir, args.dim, args.image_size, args.items))
    maker.start()
    maker.join()
    if maker.exitcode != 0:
        raise SystemExit("could not make the benchmark's model and gallery")
    model = make_model(workdir, args.dim, args.image_size)
    gallery, query = make_gallery(workdir, model, args.items)
    argv = ["search", "--gallery", str(gallery), str(query), "--json", "--device", "cpu"]
    commands = {
        "after": [sys.executable, "-c", RUN_CLI, *argv],
        "before": [sys.executable, "-c", f"{HEAVY}; {RUN_CLI}", *argv],
    }
    measure(commands["after"])  # warm the page cache for both
    samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in commands}
    for _ in range(args.repeats):
        for name, command in commands.items():  # interleaved: load changes hit both alike
            samples[name].append(measure(command))
    results: dict = {
        "items": args.items,
        "dim": args.dim,
        "image_size": args.image_size,
        "repeats": args.repeats,
        "load_average": os.getloadavg(),
        "cpus": os.cpu_count(),
    }
    for name, runs in samples.items():
        results[name] = {
            "wall_s": statistics.median(wall for wall, _, _ in runs),
            "peak_mb": statistics.median(peak for _, peak, _ in runs),
            "cpu_s": statistics.median(cpu for _, _, cpu in runs),
            "wall_s_all": [round(wall, 3) for wall, _, _ in runs],
        }
    after, before = results["after"], results["before"]
    results["wall_ratio_after_to_before"] = after["wall_s"] / before["wall_s"]
    results["peak_ratio_after_to_before"] = after["peak_mb"] / before["peak_mb"]
    results["goal_met"] = after["wall_s"] <= GOAL_WALL_S and after["peak_mb"] <= GOAL_PEAK_MB
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
        results = run(args, args.workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="nearsight-cli-search-") as work:
            results = run(args, Path(work))
    print(
        f"one `nearsight search` of an ONNX gallery of {results['items']} items "
        f"(dim {results['dim']}, {results['image_size']} px ResNet-50), median of "
        f"{results['repeats']}, load average {results['load_average'][0]:.2f}:"
    )
    for name in ("before", "after"):
        entry = results[name]
        print(
            f"  {name:>6}: {entry['wall_s']:.2f} s wall, {entry['cpu_s']:.2f} s CPU, "
            f"{entry['peak_mb']:.0f} MB peak RSS"
        )
    print(
        f"  after/before: wall {results['wall_ratio_after_to_before']:.2f}, "
        f"peak {results['peak_ratio_after_to_before']:.2f}; goal (<= {GOAL_WALL_S} s, "
        f"<= {GOAL_PEAK_MB:.0f} MB): {'met' if results['goal_met'] else 'NOT met'}"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
