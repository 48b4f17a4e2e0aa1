"""Pretrained timm weights, offline first (nearsight/models/timm_weights.py): a Hugging Face hub
cache written on disk in the hub's own layout is read with the network off; an empty cache
without a network is one line, within seconds."""

from __future__ import annotations

import socket
import time

import pytest
import torch
from helpers import TIMM_CONVNEXT, TIMM_VIT, assert_one_line_error, run, write_hub_weights

from nearsight.core.errors import NearsightError
from nearsight.data.datasets.synthetic import write_synthetic
from nearsight.models.checkpoint import load_checkpoint
from nearsight.models.embedding import EmbeddingConfig, build_embedding_net
from nearsight.models.timm_trunk import timm_info, timm_model
from nearsight.models.timm_weights import hub_cached_file, hub_weights_file
from nearsight.training.config import load_config

VIT_REPO = "timm/test_vit.r160_in1k"  # timm's hf_hub_id for test_vit


def pretrained_vit(seed: int = 7) -> dict[str, torch.Tensor]:
    """A test_vit state_dict as the hub holds it: 160 px, with its 1000-class classifier."""
    torch.manual_seed(seed)
    model, _ = timm_model("test_vit", 160, pretrained=False)
    model.reset_classifier(1000)
    return {key: value.detach().clone() for key, value in model.state_dict().items()}


def test_the_test_models_hub_id_is_the_one_the_cache_is_written_for():
    assert timm_info(TIMM_VIT).hf_hub_id == VIT_REPO


def test_hub_weights_load_exactly_from_the_cache_offline(hf_cache):
    saved = pretrained_vit()
    snapshot = write_hub_weights(hf_cache, VIT_REPO, saved)
    assert hub_cached_file(TIMM_VIT) == snapshot
    net = build_embedding_net(
        EmbeddingConfig(arch=TIMM_VIT, dim=8, image_size=160, pretrained="hub")
    )
    trunk = net.trunk.state_dict()
    assert set(trunk) == set(saved) - {"head.weight", "head.bias"}  # the classifier is dropped
    for key, value in trunk.items():
        assert torch.equal(value, saved[key]), key


def test_hub_weights_follow_a_smaller_input_size(hf_cache):
    """timm's loader resamples the position embeddings to the size trained at."""
    saved = pretrained_vit()
    write_hub_weights(hf_cache, VIT_REPO, saved)
    net = build_embedding_net(
        EmbeddingConfig(arch=TIMM_VIT, dim=8, image_size=32, pretrained="hub")
    )
    assert tuple(net.trunk.pos_embed.shape) == (1, 1 + 2 * 2, 64)
    assert torch.equal(net.trunk.blocks[3].mlp.fc1.weight, saved["blocks.3.mlp.fc1.weight"])


def test_an_empty_cache_offline_is_one_line_within_seconds(hf_cache):
    start = time.perf_counter()
    with pytest.raises(NearsightError) as error:
        hub_weights_file(TIMM_VIT)
    seconds = time.perf_counter() - start
    message = str(error.value)
    assert seconds < 5  # no network wait at all: HF_HUB_OFFLINE is set
    assert "\n" not in message
    for fragment in ("timm:test_vit", str(hf_cache), f"hf download {VIT_REPO}", "HF_HUB_OFFLINE"):
        assert fragment in message


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed again when the block ends: connections refused


def test_no_network_is_one_line_within_seconds(hf_cache, monkeypatch):
    """Not offline by setting: the connection check fails (refused here) and says so."""
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    start = time.perf_counter()
    with pytest.raises(NearsightError) as error:
        hub_weights_file(TIMM_VIT)
    assert time.perf_counter() - start < 10  # the connection check's timeout is 3 s
    message = str(error.value)
    assert "cannot connect to 127.0.0.1" in message and str(hf_cache) in message
    assert f"hf download {VIT_REPO}" in message


def test_auto_takes_the_cache_when_it_holds_the_weights(hf_cache):
    overrides = {"model.arch": TIMM_VIT, "data.image_size": 32}
    assert load_config(None, overrides).model.pretrained == "none"
    write_hub_weights(hf_cache, VIT_REPO, pretrained_vit())
    config = load_config(None, overrides)
    assert config.model.pretrained == "hub" and "model.pretrained" in config.auto
    # and the rest of the pretrained config: the resize from its crop, its class token
    assert config.data.resize == 33 and config.model.pooling == "token"
    assert config.model.heads == ["blocks.5"]


def test_a_safetensors_file_loads_exactly(tmp_path):
    from safetensors.torch import save_file

    saved = pretrained_vit(seed=3)
    file = tmp_path / "vit.safetensors"
    save_file(saved, str(file))
    net = build_embedding_net(
        EmbeddingConfig(arch=TIMM_VIT, dim=8, image_size=160, pretrained=str(file))
    )
    for key, value in net.trunk.state_dict().items():
        assert torch.equal(value, saved[key]), key


def test_weights_of_another_model_are_one_line(tmp_path):
    torch.manual_seed(0)
    other = build_embedding_net(EmbeddingConfig(arch=TIMM_CONVNEXT, dim=8, image_size=32))
    file = tmp_path / "convnext.pth"
    torch.save(other.trunk.state_dict(), file)
    with pytest.raises(NearsightError, match=r"do not fit timm:test_vit") as error:
        build_embedding_net(EmbeddingConfig(arch=TIMM_VIT, image_size=32, pretrained=str(file)))
    assert "\n" not in str(error.value)


def test_train_with_hub_weights_from_the_command_line(hf_cache, tmp_path, capsys):
    """``--pretrained hub`` with the network off: the run starts from those exact weights
    (the trunk frozen for the whole run, so best.pt still holds them)."""
    saved = pretrained_vit()
    write_hub_weights(hf_cache, VIT_REPO, saved)
    data = tmp_path / "data"
    write_synthetic(data, classes=6, per_class=4, size=48, seed=0)
    argv = ["train", "--dataset", "folder", "--root", data, "--loss", "rankmi",
            "--pretrained", "hub", "--image-size", "160", "--steps", "2",
            "--classes-per-batch", "3", "--per-class", "2", "--workers", "0", "--device", "cpu",
            "--set", f"model.arch={TIMM_VIT}", "--set", "optim.freeze_trunk_steps=2",
            "--set", "model.dim=8", "--out", tmp_path / "run"]  # fmt: skip
    code, _, err = run(capsys, *argv)
    assert code == 0, err
    state = load_checkpoint(tmp_path / "run" / "best.pt")["state_dict"]
    for key, value in saved.items():
        if not key.startswith("head."):
            assert torch.equal(state[f"trunk.{key}"], value), key


def test_train_with_hub_and_an_empty_cache_is_one_line(hf_cache, tmp_path, capsys):
    data = tmp_path / "data"
    write_synthetic(data, classes=4, per_class=3, size=32, seed=0)
    argv = ["train", "--dataset", "folder", "--root", data, "--loss", "rankmi",
            "--pretrained", "hub", "--image-size", "32", "--steps", "1", "--workers", "0",
            "--set", f"model.arch={TIMM_VIT}", "--out", tmp_path / "run"]  # fmt: skip
    start = time.perf_counter()
    code, _, err = run(capsys, *argv)
    assert (
        time.perf_counter() - start < 30
    )  # loads the data and the model; never waits on a network
    assert_one_line_error(code, err, "timm:test_vit", str(hf_cache), f"hf download {VIT_REPO}")
