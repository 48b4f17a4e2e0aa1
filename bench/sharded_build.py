"""CPU time of a sharded gallery build on one machine: `nearsight index build` in one process
against `torchrun --standalone --nproc_per_node 2` (issue 27: each rank must take its share
of the cores, so two processes cost about the CPU time of one).

    python bench/sharded_build.py [--images 7168] [--size 32] [--arch resnet50]

Both builds embed the same synthetic folder with the same ONNX model; the bench reports each
one's wall time and CPU time (user + system of the processes, from getrusage of the children),
the ratio, and checks that the two galleries hold the same ids and vectors. Under torchrun
OMP_NUM_THREADS is 1 per process by torchrun's own default; ``--no-omp-env`` removes it, so
that only LOCAL_WORLD_SIZE tells each rank its share. A script, not a test.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), cpu_seconds()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(done.stderr[-3000:])
    return time.perf_counter() - wall, cpu_seconds() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=7168)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--arch", default="resnet50")
    parser.add_argument("--no-omp-env", action="store_true")
    args = parser.parse_args()

    import torch

    from nearsight.data.datasets.synthetic import write_synthetic
    from nearsight.index.gallery.core import Gallery
    from nearsight.models.checkpoint import save_checkpoint
    from nearsight.models.embedding import EmbeddingConfig, EmbeddingNet
    from nearsight.models.export import export_onnx

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        per_class = 64
        write_synthetic(root / "data", classes=args.images // per_class, per_class=per_class,
                        size=args.size)  # fmt: skip
        torch.manual_seed(0)
        config = EmbeddingConfig(dim=64, image_size=args.size, arch=args.arch, pretrained="none")
        save_checkpoint(root / "model.pt", EmbeddingNet(config))
        export_onnx(root / "model.pt", root / "model.onnx")
        build = ["index", "build", "--model", str(root / "model.onnx"), "--dataset", "folder",
                 "--root", str(root / "data"), "--split", "all"]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS",)}
        env["TMPDIR"] = str(root / "tmp")  # torchrun's torchelastic_* folder goes with the rest
        (root / "tmp").mkdir()
        one = timed([sys.executable, "-m", "nearsight.app.cli", *build, "--out",
                     str(root / "one")], env)  # fmt: skip
        torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
        launch = [torchrun, "--standalone", "--nproc_per_node", "2"]
        if args.no_omp_env:
            launch = [sys.executable, "-c", "import os, sys, runpy; os.environ.pop("
                      "'OMP_NUM_THREADS', None); sys.argv = sys.argv[1:]; "
                      "runpy.run_module('torch.distributed.run', run_name='__main__')",
                      "--standalone", "--nproc_per_node", "2"]  # fmt: skip
        two = timed([*launch, "-m", "nearsight.app.cli", *build, "--out", str(root / "two")], env)
        with Gallery.open(root / "one") as a, Gallery.open(root / "two") as b:
            same_ids = np.array_equal(np.array(a.ids), np.array(b.ids))
            gap = float(np.abs(np.array(a.embeddings) - np.array(b.embeddings)).max())
    print(f"{args.images} images, {args.size} px, {args.arch}, ONNX")
    print(f"1 process : wall {one[0]:6.1f} s  CPU {one[1]:6.1f} s")
    print(f"2 processes: wall {two[0]:6.1f} s  CPU {two[1]:6.1f} s")
    print(
        f"CPU ratio 2 / 1: {two[1] / one[1]:.2f} (goal < 1.3); same ids {same_ids}, "
        f"largest vector difference {gap:.2e}"
    )
    print(f"load average {os.getloadavg()[0]:.2f} (cores: {os.cpu_count()})")


if __name__ == "__main__":
    main()
