"""The trainer with the losses of issue 14: multi-level heads end to end (train, export, gallery,
eval), the proxy losses' own parameters (their optimiser group, resume, DDP), RankMI's steps.

The runs use a ResNet-18 trunk: what is tested (heads, proxies, resume, DDP, the schedule) is
the trainer's and the same for every torchvision ResNet, and the smaller trunk makes each
step and checkpoint a fraction of ResNet-50's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import onnx
import pytest
import torch
from helpers import crash_training, read_jsonl, torchrun

from nearsight.app.cli import main
from nearsight.models.checkpoint import load_checkpoint, load_embedding_net
from nearsight.models.spec import spec_from_onnx_metadata
from nearsight.training import trainer as trainer_module
from nearsight.training.config import load_config
from nearsight.training.run import train

DIM = 8
ARCH = "resnet18"
TINY_TRAIN = [
    "--dataset", "folder", "--dim", str(DIM), "--image-size", "32",
    "--classes-per-batch", "3", "--per-class", "2", "--workers", "0",
    "--set", f"model.arch={ARCH}", "--set", "data.eval_batch_size=16", "--set", "log_every=1",
]  # fmt: skip


def train_cli(root: Path, out: Path, loss: str, steps: int, *extra: str) -> None:
    argv = ["train", *TINY_TRAIN, "--root", str(root), "--loss", loss, "--out", str(out)]
    assert main([*argv, "--steps", str(steps), *extra]) == 0


@pytest.mark.slow
def test_concat_heads_train_export_index_and_evaluate(synth, tmp_path, capsys):
    run = tmp_path / "run"
    heads = ["--set", "model.heads=[layer2,layer3,layer4]", "--set", "model.embedding=concat"]
    train_cli(synth, run, "rll", 2, *heads)
    net = load_embedding_net(run / "best.pt")
    assert net.config.heads == ["layer2", "layer3", "layer4"] and net.dim == 3 * DIM

    model = tmp_path / "model.onnx"
    assert main(["export", "--checkpoint", str(run / "best.pt"), "--out", str(model)]) == 0
    graph = onnx.load(str(model)).graph
    assert graph.output[0].type.tensor_type.shape.dim[1].dim_value == 3 * DIM
    meta = {p.key: p.value for p in onnx.load(str(model)).metadata_props}
    assert spec_from_onnx_metadata(meta).output_dim == 3 * DIM

    gallery = tmp_path / "gallery"
    argv = ["index", "build", "--model", str(model), "--dataset", "folder", "--root", str(synth)]
    assert main([*argv, "--out", str(gallery), "--workers", "0"]) == 0
    capsys.readouterr()
    assert main(["eval", "--gallery", str(gallery), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["queries"] == 16 and 0.0 <= result["recall@1"] <= 1.0


def tiny_config(root: Path, loss: str, steps: int, **extra):
    overrides = {
        "data.dataset": "folder",
        "data.root": str(root),
        "data.image_size": 32,
        "data.workers": 0,
        "data.eval_batch_size": 16,
        "model.arch": ARCH,
        "model.dim": DIM,
        "model.pretrained": "none",
        "sampler.classes_per_batch": 3,
        "sampler.per_class": 2,
        "loss.name": loss,
        "steps": steps,
        "eval_every": 10**9,  # one evaluation, at the end
        "save_every": 10**9,  # last.pt at the end (and where a test sets save_every)
        "log_every": 1,
    }
    overrides.update(extra)
    return load_config(None, overrides)


@pytest.mark.parametrize("loss", ["proxyanchor", pytest.param("arcface", marks=pytest.mark.slow)])
def test_proxy_loss_trains_its_proxies_and_resumes_exactly(synth, tmp_path, monkeypatch, loss):
    # evaluated and saved at step 3 (the checkpoint a resume starts from) and at the end
    settings = {"optim.loss_lr": 0.05, "eval_every": 3, "save_every": 3}
    config = tiny_config(synth, loss, steps=5, **settings)
    straight = tmp_path / "straight"
    train(config, straight)
    last = load_checkpoint(straight / "last.pt")
    groups = {g["name"]: g for g in last["optimizer"]["param_groups"]}
    assert groups[f"{loss}_proxies"]["base_lr"] == 0.05  # its own group, its own rate
    (proxies,) = last["loss_state"].values()
    assert proxies.shape[0 if loss == "proxyanchor" else 1] == 4  # the 4 training classes

    interrupted = tmp_path / "interrupted"
    # steps 1-3 done and saved, die inside step 4
    crash_training(config, interrupted, monkeypatch, in_step=4)
    saved = load_checkpoint(interrupted / "last.pt")
    assert saved["state"]["step"] == 3
    # the proxies moved: those of step 3 are not those of step 5
    (after_three,) = saved["loss_state"].values()
    assert (proxies - after_three).abs().max() > 1e-4
    train(config, interrupted, resume=True)
    losses_a = [r["loss"] for r in read_jsonl(straight / "train.jsonl")]
    losses_b = [r["loss"] for r in read_jsonl(interrupted / "train.jsonl")]
    assert len(losses_a) == 5
    assert losses_b == pytest.approx(losses_a, rel=1e-6, abs=1e-7)
    (resumed,) = load_checkpoint(interrupted / "last.pt")["loss_state"].values()
    torch.testing.assert_close(resumed, proxies, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_freeze_trunk_steps_train_only_the_new_layers(synth, tmp_path, monkeypatch):
    states: list[dict] = []  # last.pt after steps 1, 2 and 3 of one run

    def keeping_save(trainer, state):
        real_save(trainer, state)
        states.append(load_checkpoint(trainer.files.out_dir / "last.pt"))

    real_save = trainer_module.save_last
    monkeypatch.setattr(trainer_module, "save_last", keeping_save)
    extra = {"optim.freeze_trunk_steps": 2, "optim.loss_lr": 0.05, "model.freeze_bn": True}
    train(tiny_config(synth, "proxyanchor", steps=3, save_every=1, **extra), tmp_path / "run")
    one, two, three = states
    assert [s["state"]["step"] for s in states] == [1, 2, 3]
    trunk = [k for k in one["state_dict"] if k.startswith("trunk.") and "running" not in k]
    trunk = [k for k in trunk if one["state_dict"][k].is_floating_point()]
    for key in trunk:  # frozen for the first two steps, moving at the third
        assert torch.equal(one["state_dict"][key], two["state_dict"][key]), key
    assert any(not torch.equal(two["state_dict"][k], three["state_dict"][k]) for k in trunk)
    assert not torch.equal(
        one["state_dict"]["embedding.weight"], two["state_dict"]["embedding.weight"]
    )
    (p1,), (p2,) = one["loss_state"].values(), two["loss_state"].values()
    assert not torch.equal(p1, p2)


def test_multi_head_training_sums_the_heads_losses(synth, tmp_path):
    heads = {"model.heads": ["layer2", "layer3", "layer4"], "loss.params": {"scale": 16}}
    out = tmp_path / "ice3"
    train(tiny_config(synth, "ice", steps=1, **heads), out)
    last = load_checkpoint(out / "last.pt")
    # the side heads trained (their own groups' parameters moved off their zero bias)
    assert last["state_dict"]["side_embeddings.layer2.bias"].abs().sum() > 0
    assert last["model_spec"]["heads"] == ["layer2", "layer3", "layer4"]
    # the logged loss of step 1 is the sum of the three heads' ICE values on that batch
    first = read_jsonl(out / "train.jsonl")[0]["loss"]
    single = tmp_path / "ice1"
    train(tiny_config(synth, "ice", steps=1, **{"loss.params": {"scale": 16}}), single)
    assert first > read_jsonl(single / "train.jsonl")[0]["loss"]


def test_rankmi_schedule_advances_on_embedding_updates_only(synth, tmp_path):
    schedule = {"optim.schedule": "cosine", "optim.warmup_steps": 0}
    train(tiny_config(synth, "rankmi", steps=4, **schedule), tmp_path / "rankmi")
    train(tiny_config(synth, "ice", steps=4, **schedule), tmp_path / "ice")
    rankmi = read_jsonl(tmp_path / "rankmi" / "train.jsonl")
    ice = read_jsonl(tmp_path / "ice" / "train.jsonl")
    updates = [r for r in rankmi if r.get("phase") != "critic"]
    assert len(updates) == 4 and len(rankmi) == 7  # 4 embedding updates, 3 critic batches
    assert [r["lr_head"] for r in updates] == [r["lr_head"] for r in ice]


@pytest.mark.slow
def test_two_process_ddp_proxies_follow_the_single_process_run(synth, tmp_path):
    """torchrun with 2 CPU processes (gloo), plain SGD (scale-sensitive, unlike Adam): the
    proxies' gradient is the full batch's, so loss curve and proxies match one process (run
    here, in this process: only the two-process run needs processes of its own)."""
    common = [
        *TINY_TRAIN, "--root", str(synth), "--loss", "proxyanchor", "--steps", "3",
        "--device", "cpu", "--set", "model.freeze_bn=true", "--set", "model.feature_norm=none",
        "--set", "optim.name=sgd", "--set", "optim.loss_lr=0.5", "--set", "eval_every=3",
        # fp32: the two runs agree to float rounding (bf16 autocast, the default on CPUs with
        # native bf16, rounds the two batch splits apart)
        "--set", "amp=false", "--set", "channels_last=false",
    ]  # fmt: skip
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    assert main(["train", *common, "--out", str(single)]) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = torchrun(["-m", "nearsight.app.cli", "train", *common, "--out", str(ddp)],
                      tmp_path / "tmp", env=env, capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    a = [r["loss"] for r in read_jsonl(single / "train.jsonl")]
    b = [r["loss"] for r in read_jsonl(ddp / "train.jsonl")]
    assert len(a) == 3
    assert b == pytest.approx(a, rel=1e-4, abs=1e-5)
    (pa,) = load_checkpoint(single / "last.pt")["loss_state"].values()
    (pb,) = load_checkpoint(ddp / "last.pt")["loss_state"].values()
    torch.testing.assert_close(pb, pa, rtol=1e-4, atol=1e-5)
