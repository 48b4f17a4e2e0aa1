"""The trainer end to end at a tiny size: run folder, resume, RankMI's alternation, DDP."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from helpers import TINY_TRAIN, crash_training, read_jsonl, train_one_and_two_processes

from nearsight.app.cli import main
from nearsight.models.checkpoint import load_checkpoint, load_embedding_net
from nearsight.training.config import load_config
from nearsight.training.run import train
from nearsight.training.schedule import LRSchedule

TINY = {
    **TINY_TRAIN,
    "model.arch": "resnet18",  # the smallest torchvision trunk: no test here is of the trunk
    "eval_every": 3,
    "save_every": 1,
    "log_every": 1,
}


def tiny_config(root: Path, loss: str = "ice", steps: int = 6, **extra):
    overrides = dict(TINY)
    overrides.update({"data.root": str(root), "loss.name": loss, "steps": steps})
    overrides.update(extra)
    return load_config(None, overrides)


def test_run_dir_holds_every_artifact(synth, tmp_path):
    out = tmp_path / "run"
    summary = train(tiny_config(synth, steps=4, eval_at_start=True), out)
    assert summary.steps == 4
    for name in ("config.yaml", "best.pt", "last.pt", "metrics.jsonl", "train.jsonl"):
        assert (out / name).exists(), name
    assert any((out / "tensorboard").iterdir())
    evaluations = read_jsonl(out / "metrics.jsonl")
    # step 0 (untrained), step 3 (eval_every) and the final step 4
    assert [e["step"] for e in evaluations] == [0, 3, 4]
    assert evaluations[-1]["queries"] == 16  # 4 test classes x 4 images
    assert set(evaluations[-1]) >= {"recall@1", "recall@2", "recall@4", "recall@8", "nmi", "map@r"}
    assert [r["step"] for r in read_jsonl(out / "train.jsonl")] == [1, 2, 3, 4]
    # the saved config is the resolved one and loads back to the same settings
    saved = load_config(out / "config.yaml")
    assert saved.to_dict() == yaml.safe_load((out / "config.yaml").read_text())
    assert saved.steps == 4 and saved.model.dim == 16
    # best.pt loads with the models package alone and embeds to unit vectors
    net = load_embedding_net(out / "best.pt")
    with torch.no_grad():
        emb = net(torch.rand(2, 3, 32, 32))
    assert emb.shape == (2, 16)
    torch.testing.assert_close(emb.norm(dim=1), torch.ones(2))
    best = load_checkpoint(out / "best.pt")
    assert best["training"]["loss"] == "ice"
    # no classes held out: best.pt is the best test evaluation, and says so
    assert best["training"]["selected_by"] == summary.selected_by == "test/recall@1"
    assert best["training"]["metrics"]["recall@1"] == max(e["recall@1"] for e in evaluations)


def test_clip_grad_value_bounds_every_update(synth, tmp_path):
    """optim.clip_grad_value (Proxy Anchor's clip at 10): with plain SGD at rate 1 and no
    weight decay, one step moves no weight by more than the clip value."""
    from nearsight.models.checkpoint import load_checkpoint as load

    settings = {"optim.name": "sgd", "optim.momentum": 0.0, "optim.weight_decay": 0.0,
                "optim.lr": 1.0, "optim.head_lr": 1.0, "optim.schedule": "constant",
                "optim.warmup_steps": 0, "eval_every": 10}  # fmt: skip
    clip = 1e-4
    out = tmp_path / "clipped"
    # ResNet-50: on it the step-1 evaluation does not beat step 0's, so best.pt stays step 0's
    train(tiny_config(synth, steps=1, eval_at_start=True, **settings,
                      **{"optim.clip_grad_value": clip, "model.arch": "resnet50"}), out)  # fmt: skip
    assert load(out / "best.pt")["training"]["step"] == 0
    before = load(out / "best.pt")["state_dict"]  # step 0, the untrained network
    after = load(out / "last.pt")["state_dict"]
    # parameters only: BatchNorm's running statistics are buffers, not updates
    weights = [k for k in after if after[k].is_floating_point() and "running_" not in k]
    moved = max(float((after[k] - before[k]).abs().max()) for k in weights)
    # some gradient exceeds the clip, so the largest move is the clip (to float32 rounding)
    assert moved == pytest.approx(clip, rel=0.01)


def test_existing_run_is_not_overwritten(synth, tmp_path):
    out = tmp_path / "run"
    train(tiny_config(synth, steps=1), out)
    with pytest.raises(Exception, match="--resume"):
        train(tiny_config(synth, steps=1), out)


@pytest.mark.parametrize("loss", ["ice", "rankmi"])
def test_interrupt_and_resume_reproduces_the_uninterrupted_run(synth, tmp_path, monkeypatch, loss):
    config = tiny_config(synth, loss=loss, steps=6)
    straight = tmp_path / "straight"
    train(config, straight)

    interrupted = tmp_path / "interrupted"
    # steps 1-4 done and saved (save_every=1), die inside step 5
    crash_training(config, interrupted, monkeypatch, in_step=5)
    # last.pt is saved after updates of the embedding: RankMI's batch 4 is a critic batch
    saved = load_checkpoint(interrupted / "last.pt")["state"]["batch"]
    assert saved == (4 if loss == "ice" else 3)
    train(config, interrupted, resume=True)

    assert read_jsonl(interrupted / "metrics.jsonl") == read_jsonl(straight / "metrics.jsonl")
    losses_a = [r["loss"] for r in read_jsonl(straight / "train.jsonl")]
    losses_b = [r["loss"] for r in read_jsonl(interrupted / "train.jsonl")]
    assert losses_b == pytest.approx(losses_a, rel=1e-6, abs=1e-7)
    a = load_checkpoint(straight / "last.pt")["state_dict"]
    b = load_checkpoint(interrupted / "last.pt")["state_dict"]
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-6, atol=1e-7, msg=key)


def test_rankmi_alternates_critic_and_embedding_steps(synth, tmp_path):
    out = tmp_path / "rankmi"
    result = train(tiny_config(synth, loss="rankmi", steps=3), out)
    last = load_checkpoint(out / "last.pt")
    # Algorithm 1 with k = 1: batch t updates the critic when t mod 2 != 0, else the embedding;
    # `steps` counts updates of the embedding, so 3 steps take 5 batches
    assert (result.steps, result.batches) == (3, 5)
    lines = read_jsonl(out / "train.jsonl")
    phases = [r.get("phase", "embedding") for r in lines]
    assert phases == ["embedding", "critic", "embedding", "critic", "embedding"]
    assert [r["step"] for r in lines] == [1, 1, 2, 2, 3]
    critic_steps = [s["step"] for s in last["critic_optimizer"]["state"].values()]
    assert critic_steps and all(int(s) == 2 for s in critic_steps)
    embedding_steps = [s["step"] for s in last["optimizer"]["state"].values()]
    assert embedding_steps and all(int(s) == 3 for s in embedding_steps)
    assert 0.0 <= float(last["loss_state"]["beta_state"]) <= 2.0


def test_bcontrastive_gets_class_counts_and_design_from_the_sampler(synth, tmp_path):
    result = train(tiny_config(synth, loss="bcontrastive", steps=2), tmp_path / "bc")
    assert result.steps == 2


def test_learning_rate_schedules():
    step = LRSchedule("step", total_steps=100, milestones=(50,), gamma=0.1)
    assert step.factor(0) == 1.0 and step.factor(50) == pytest.approx(0.1)
    # milestones below 1 are shares of the run: here of the time limit
    by_time = LRSchedule("step", time_limit_s=10.0, milestones=(0.5,), gamma=0.1)
    assert by_time.factor(1000, 4.9) == 1.0 and by_time.factor(3, 5.0) == pytest.approx(0.1)
    cosine = LRSchedule("cosine", warmup_steps=10, total_steps=100)
    assert cosine.factor(0) == pytest.approx(0.1)  # linear warmup: (0 + 1) / 10
    assert cosine.factor(9) == pytest.approx(1.0)
    assert cosine.factor(10) == pytest.approx(1.0)
    assert cosine.factor(55) == pytest.approx(0.5)  # half-way through the decay
    assert cosine.factor(100) == pytest.approx(0.0, abs=1e-12)
    # a time limit: the decay follows the seconds used, and ends at the low rate
    timed = LRSchedule("cosine", warmup_steps=0, time_limit_s=60.0)
    assert timed.factor(7, 30.0) == pytest.approx(0.5)
    assert timed.factor(7, 60.0) == pytest.approx(0.0, abs=1e-12)
    # steps and time: whichever is further along
    both = LRSchedule("cosine", total_steps=100, time_limit_s=60.0)
    assert both.factor(50, 15.0) == pytest.approx(0.5)
    assert both.factor(10, 30.0) == pytest.approx(0.5)


def test_cli_train_and_bad_input(synth, tmp_path, capsys):
    out = tmp_path / "cli"
    args = [
        "train",
        "--dataset",
        "folder",
        "--root",
        str(synth),
        "--loss",
        "nra",
        "--out",
        str(out),
        "--dim",
        "16",
        "--image-size",
        "32",
        "--steps",
        "2",
        "--classes-per-batch",
        "3",
        "--per-class",
        "2",
        "--workers",
        "0",
        "--set",
        "data.eval_batch_size=16",
        "--set",
        "model.arch=resnet18",
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "best.pt (step" in printed and "last.pt (step 2): test recall@1" in printed
    assert load_config(out / "config.yaml").loss.name == "nra"
    # a wrong layout is one line and exit 2
    assert (
        main(
            [
                "train",
                "--dataset",
                "cub",
                "--root",
                str(tmp_path),
                "--loss",
                "ice",
                "--out",
                str(tmp_path / "x"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.startswith("nearsight: error:") and "\n" not in err
    # an unknown loss is refused before any data is read, listing the valid ones
    assert (
        main(
            [
                "train",
                "--dataset",
                "folder",
                "--root",
                str(synth),
                "--loss",
                "nope",
                "--out",
                str(tmp_path / "y"),
                "--steps",
                "1",
            ]
        )
        == 2
    )
    assert "rll" in capsys.readouterr().err


@pytest.mark.slow
def test_two_process_ddp_follows_the_single_process_loss_curve(synth, tmp_path):
    """torchrun with 2 CPU processes (gloo): each embeds half of the same global batch, the
    loss sees the whole batch, so the loss curve matches one process (no BatchNorm in train
    mode: the trunk's frozen, the head's feature_norm off)."""
    common = [
        "--dataset",
        "folder",
        "--root",
        str(synth),
        "--loss",
        "ice",
        "--dim",
        "16",
        "--image-size",
        "32",
        "--steps",
        "4",
        "--classes-per-batch",
        "3",
        "--per-class",
        "2",
        "--workers",
        "0",
        "--eval-every",
        "4",
        "--device",
        "cpu",
        "--set",
        "model.arch=resnet18",
        "--set",
        "model.freeze_bn=true",
        "--set",
        "model.feature_norm=none",  # batch statistics are per process: not comparable
        "--set",
        "data.eval_batch_size=16",
    ]
    single, ddp = train_one_and_two_processes(common, tmp_path)
    a = [r["loss"] for r in read_jsonl(single / "train.jsonl")]
    b = [r["loss"] for r in read_jsonl(ddp / "train.jsonl")]
    assert len(a) == len(b) == 4
    assert b == pytest.approx(a, rel=1e-3, abs=1e-4)
