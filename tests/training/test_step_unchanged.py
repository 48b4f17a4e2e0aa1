"""The trainer's losses are those of the step before issue 55's rework (no host sync, device
prefetch, deferred logging): a fixed-seed fp32 CPU run of every seed loss, Proxy Anchor, the
multi-level heads and SGD logs the losses recorded from the previous trainer (commit f16dc92)."""

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
RECORDED = {
    "ice": [25.813283920288086, 27.945600509643555, 47.2651252746582, 11.788978576660156,
            3.8815395832061768],
    "rll": [0.7830105423927307, 0.7915872931480408, 0.9018357396125793, 0.49653998017311096,
            0.40074634552001953],
    "nra": [18.129457473754883, 21.07820701599121, 16.62043571472168, 18.55806541442871,
            6.571298599243164],
    "rankmi": [0.42211198806762695, 0.042410850524902344, 0.31522107124328613,
               0.025743842124938965, -0.041305482387542725, -0.13804441690444946,
               0.14689582586288452, 0.15092003345489502, 0.40990638732910156],
    "bcontrastive": [0.48890823125839233, 0.4111214280128479, 0.6593836545944214,
                     0.3919491767883301, 0.27304261922836304],
    "proxyanchor": [22.240341186523438, 24.417556762695312, 17.27585220336914,
                    14.6434326171875, 20.30211067199707],
    "ice-heads": [51.1256103515625, 64.21389770507812, 63.62187194824219, 58.33258819580078,
                  44.229373931884766],
    "sgd-nra": [18.129457473754883, 19.547950744628906, 9.580048561096191, 23.923431396484375,
                16.81329917907715],
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
