"""Training with timm trunks (``model.arch: timm:NAME``): a few steps with the seed losses from
the command line, the trunk's pretrained config in the run's settings and its checkpoint,
``freeze_trunk_steps`` and multi-level heads on a CNN's stages. Tiny random timm models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from helpers import TIMM_CONVNEXT, TIMM_VIT, run

from nearsight.models.checkpoint import load_checkpoint, load_embedding_net

TINY = ["--dataset", "folder", "--image-size", "32", "--classes-per-batch", "3",
        "--per-class", "2", "--workers", "0", "--device", "cpu", "--set", "model.dim=8",
        "--set", "data.eval_batch_size=16", "--set", "save_every=1"]  # fmt: skip


@pytest.fixture(scope="module")
def synth(synthetic_folder) -> Path:
    return synthetic_folder(size=40)


def losses(out: Path) -> list[float]:
    lines = (out / "train.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines if '"critic"' not in line]


@pytest.mark.parametrize("loss", ["ice", "rankmi", "nra", "bcontrastive", "rll", "proxyanchor"])
def test_a_vit_trains_a_few_steps_with_each_seed_loss(loss, synth, tmp_path, capsys, hf_cache):
    out = tmp_path / "run"
    code, _, err = run(capsys, "train", *TINY, "--root", synth, "--loss", loss, "--steps", "3",
                       "--set", f"model.arch={TIMM_VIT}", "--out", out)  # fmt: skip
    assert code == 0, err
    assert "no weights for timm:test_vit in the Hugging Face cache" in err  # auto: none, a note
    values = losses(out)
    assert len(values) == 3 and all(v == v and abs(v) < 1e6 for v in values)  # finite
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["model"]["pooling"] == "token" and config["model"]["heads"] == ["blocks.5"]
    assert config["data"]["resize"] == 33  # floor(32 / 0.95): test_vit's pretrained crop
    spec = load_checkpoint(out / "best.pt")["model_spec"]
    assert spec["arch"] == TIMM_VIT and spec["interpolation"] == "bicubic"
    assert spec["mean"] == [0.5, 0.5, 0.5] and spec["test_resize"] == 33
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["step"] == 3 and 0 <= metrics[-1]["recall@1"] <= 1


def test_convnext_multi_level_heads_train(synth, tmp_path, capsys, hf_cache):
    out = tmp_path / "run"
    code, _, err = run(capsys, "train", *TINY, "--root", synth, "--loss", "rll", "--steps", "2",
                       "--set", f"model.arch={TIMM_CONVNEXT}",
                       "--set", "model.heads=[stages.1,stages.2,stages.3]",
                       "--set", "model.embedding=concat", "--out", out)  # fmt: skip
    assert code == 0, err
    net = load_embedding_net(out / "best.pt")
    assert net.config.heads == ["stages.1", "stages.2", "stages.3"] and net.dim == 24
    state = load_checkpoint(out / "last.pt")["state_dict"]
    assert state["side_embeddings.stages_1.bias"].abs().sum() > 0  # the lower heads trained


def test_freeze_trunk_steps_hold_a_timm_trunk(synth, tmp_path, capsys, hf_cache):
    def trained(steps: int) -> dict:
        out = tmp_path / f"run{steps}"
        code, _, err = run(capsys, "train", *TINY, "--root", synth, "--loss", "ice",
                           "--steps", str(steps), "--set", f"model.arch={TIMM_VIT}",
                           "--set", "optim.freeze_trunk_steps=2", "--set", "optim.lr=1e-3",
                           "--out", out)  # fmt: skip
        assert code == 0, err
        return load_checkpoint(out / "last.pt")["state_dict"]

    one, two, three = trained(1), trained(2), trained(3)
    trunk = [key for key in one if key.startswith("trunk.") and one[key].is_floating_point()]
    for key in trunk:  # frozen for the first two steps, moving at the third
        assert torch.equal(one[key], two[key]), key
    assert any(not torch.equal(two[key], three[key]) for key in trunk)
    assert not torch.equal(one["embedding.weight"], two["embedding.weight"])
