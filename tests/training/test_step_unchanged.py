"""The trainer's losses are those of the step before issue 55's rework (no host sync, device
prefetch, deferred logging): a fixed-seed fp32 CPU run of every seed loss, Proxy Anchor, the
multi-level heads and SGD logs the losses recorded from the previous trainer (commit f16dc92).
The trunk is a ResNet-18: the step's code is the same for every trunk, and its runs cost a
fraction of ResNet-50's."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from helpers import TINY_TRAIN, read_jsonl

from nearsight.data.datasets.synthetic import write_synthetic
from nearsight.training import step_logs
from nearsight.training import trainer as trainer_module
from nearsight.training.config import load_config
from nearsight.training.run import train
from nearsight.training.step_io import DeferredValues

# train.jsonl's "loss" per batch (RankMI: its critic batches too), recorded before the rework
# (this file's config run at f16dc92 on a ResNet-18 trunk; the same run on ResNet-50 there gives
# the ResNet-50 numbers this file first recorded, to the last digit)
RECORDED = {
    "ice": [17.99204444885254, 26.78595542907715, 17.019407272338867, 40.25428771972656,
            14.283673286437988],
    "rll": [0.7142689824104309, 0.7866066098213196, 0.8683955669403076, 1.0656520128250122,
            0.6597977876663208],
    "nra": [15.072880744934082, 13.071242332458496, 20.238561630249023, 22.775177001953125,
            6.873288631439209],
    "rankmi": [1.31709885597229, 0.8262993097305298, 1.0967602729797363, 0.6492305994033813,
               0.5837100744247437, 0.16193163394927979, 0.6194591522216797, 0.19986915588378906,
               0.36431312561035156],
    "bcontrastive": [0.45998281240463257, 0.5132350325584412, 0.5473159551620483,
                     0.7030835747718811, 0.7205737233161926],
    "proxyanchor": [20.400386810302734, 20.419214248657227, 12.792612075805664, 15.852746963500977,
                    16.07378578186035],
    "ice-heads": [31.678539276123047, 93.23194122314453, 58.162750244140625, 92.06942749023438,
                  78.98265075683594],
    "sgd-nra": [15.072880744934082, 32.23619079589844, 14.478874206542969, 24.58567237854004,
                9.630699157714844],
}  # fmt: skip
CASES = {
    "ice-heads": {"loss.name": "ice", "model.heads": ["layer2", "layer3", "layer4"]},
    "sgd-nra": {"loss.name": "nra", "optim.name": "sgd"},
}


@pytest.fixture(scope="module")
def synth(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("synth") / "data"
    write_synthetic(root, classes=8, per_class=4, size=32, seed=0)
    return root


def fixed_seed_config(root: Path, case: str):
    overrides = {
        **TINY_TRAIN,
        "data.root": str(root),
        "eval_every": 10**9,
        "save_every": 10**9,
        "log_every": 1,
        "model.arch": "resnet18",
        "steps": 5,
        "loss.name": case,
        # fp32 on one thread: the recorded numbers do not depend on the CPU's bf16 support
        "amp": False,
        "channels_last": False,
        "device": "cpu",
        "cpu_threads": 1,
        "seed": 3,
        **CASES.get(case, {}),
    }
    return load_config(None, overrides)


@pytest.mark.parametrize("case", sorted(RECORDED))
def test_fixed_seed_losses_are_the_recorded_ones(synth, tmp_path, case):
    train(fixed_seed_config(synth, case), tmp_path / case)
    losses = [r["loss"] for r in read_jsonl(tmp_path / case / "train.jsonl")]
    assert losses == pytest.approx(RECORDED[case], rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("case", ["ice", "rankmi"])
def test_losses_read_a_step_late_are_logged_whole_and_in_order(synth, tmp_path, monkeypatch, case):
    """CUDA's path on the CPU: every loss read back a step late; the records written before
    each evaluation and checkpoint, and at the end, are the same lines in the same order."""
    monkeypatch.setattr(step_logs, "DeferredValues", functools.partial(DeferredValues, lag=1))
    saves: list[tuple[int, int]] = []  # (batches done, train.jsonl lines) at each last.pt

    def counting_save(trainer, state):
        lines = read_jsonl(trainer.files.out_dir / "train.jsonl")
        saves.append((state.batch, len(lines)))
        return real_save(trainer, state)

    real_save = trainer_module.save_last
    monkeypatch.setattr(trainer_module, "save_last", counting_save)
    config = fixed_seed_config(synth, case)
    config.eval_every, config.save_every = 2, 1
    out = tmp_path / case
    train(config, out)
    records = read_jsonl(out / "train.jsonl")
    assert [r["loss"] for r in records] == pytest.approx(RECORDED[case], rel=1e-4, abs=1e-5)
    assert [r["batch"] for r in records] == list(range(1, len(RECORDED[case]) + 1))
    assert saves and all(batches == lines for batches, lines in saves), saves
