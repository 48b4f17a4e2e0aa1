"""Training that crashes on purpose, and the same run in one and in two processes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers.processes import torchrun

# The smallest training run the tests use: 32 px, dim 16, 3 classes x 2 images, no workers, from
# scratch (each test adds its loss, root, steps and logging)
TINY_TRAIN = {
    "data.dataset": "folder",
    "data.image_size": 32,
    "data.workers": 0,
    "data.eval_batch_size": 16,
    "model.dim": 16,
    "model.pretrained": "none",
    "sampler.classes_per_batch": 3,
    "sampler.per_class": 2,
}


class TrainingCrash(Exception):
    """Raised inside a training step to stand in for a crash (a kill mid-run)."""


def train_one_and_two_processes(args: list[str], out: Path) -> tuple[Path, Path]:
    """``nearsight train *args`` once in one process (this one: a second interpreter would
    only add its imports) and once under torchrun with 2 CPU processes (gloo), one thread
    each; returns the two run folders (OUT/single, OUT/ddp)."""
    import torch

    from nearsight.app.cli import main

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # fp32: the comparison is of DDP's arithmetic, where the two runs agree to float rounding
    # (bf16 autocast, the default on CPUs with native bf16, rounds the two batch splits apart)
    args = [*args, "--set", "amp=false", "--set", "channels_last=false"]
    single, ddp = out / "single", out / "ddp"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each torchrun process
    try:
        assert main(["train", *args, "--out", str(single)]) == 0
    finally:
        torch.set_num_threads(threads)
    result = torchrun(["-m", "nearsight.app.cli", "train", *args, "--out", str(ddp)],
                      out / "tmp", env=env, capture_output=True, text=True)  # fmt: skip
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
