"""Checkpoint I/O (nearsight/models/checkpoint.py): round trip, loading without training code, damage."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nearsight.core.errors import NearsightError
from nearsight.models.checkpoint import (
    checkpoint_sha256,
    load_checkpoint,
    load_embedding_net,
    save_checkpoint,
)
from nearsight.models.embedding import EmbeddingConfig, EmbeddingNet


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[EmbeddingNet, Path]:
    """A net whose weights and BatchNorm statistics differ from a fresh build, saved once.
    ResNet-18 keeps the file small; the I/O does not depend on the architecture."""
    torch.manual_seed(0)
    net = EmbeddingNet(
        EmbeddingConfig(
            dim=12, pooling="avgmax", pretrained="imagenet", freeze_bn=True, arch="resnet18"
        )
    )
    with torch.no_grad():
        net.embedding.bias.add_(0.25)
        net.trunk.bn1.running_mean.add_(0.5)
    optimiser = torch.optim.SGD(net.head_parameters(), lr=0.1, momentum=0.9)
    net.train()
    net(torch.rand(2, 3, 32, 32)).sum().backward()
    optimiser.step()
    net.eval()
    path = tmp_path_factory.mktemp("run") / "best.pt"
    save_checkpoint(
        path,
        net,
        extra={
            "step": 7,
            "optimizer": optimiser.state_dict(),
            "sampler": {"seed": 3, "rng": torch.get_rng_state(), "order": [3, 1, 2]},
            "metrics": {"recall@1": 0.5},
        },
    )
    return net, path


def test_round_trip_gives_identical_outputs(trained):
    net, path = trained
    loaded = load_embedding_net(path)
    assert not loaded.training
    assert loaded.config == net.config
    images = torch.rand(3, 3, 48, 48)
    with torch.no_grad():
        assert torch.equal(loaded(images), net(images))
    for key, value in net.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_payload_layout_and_extra_state(trained):
    net, path = trained
    payload = load_checkpoint(path)
    assert payload["format"] == "nearsight-checkpoint"
    assert payload["version"] == 2
    assert "model_config" not in payload  # the network is described once, by its spec
    assert payload["model_training"] == {"pretrained": "imagenet", "freeze_bn": True}
    # the spec: what runs the model reads (training settings such as pretrained are not in it)
    assert payload["model_spec"] == {
        "arch": "resnet18",
        "dim": 12,
        "image_size": 224,
        "test_resize": 256,
        "pooling": "avgmax",
        "feature_norm": "none",
        "heads": ["layer4"],
        "embedding": "last",
    }
    assert payload["step"] == 7
    assert payload["sampler"]["order"] == [3, 1, 2]
    assert payload["sampler"]["rng"].dtype == torch.uint8
    momentum = payload["optimizer"]["state"][0]["momentum_buffer"]
    assert momentum.shape == net.embedding.weight.shape
    assert payload["metrics"] == {"recall@1": 0.5}


def test_extra_cannot_overwrite_reserved_keys(tmp_path, trained):
    net, _ = trained
    with pytest.raises(ValueError, match="state_dict"):
        save_checkpoint(tmp_path / "x.pt", net, extra={"state_dict": {}})
    assert not (tmp_path / "x.pt").exists()
    assert list(tmp_path.iterdir()) == []  # no temp file left behind


def test_loads_in_a_process_that_imports_only_models(trained):
    net, path = trained
    images = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        expected = net(images)
    images_path = path.parent / "images.pt"
    torch.save(images, images_path)
    script = f"""
import json, sys, torch
from nearsight.models.checkpoint import load_embedding_net
net = load_embedding_net({str(path)!r})
with torch.no_grad():
    out = net(torch.load({str(images_path)!r}))
loaded = sorted(m for m in ("training", "index", "app") if m in sys.modules)
print(json.dumps({{"loaded": loaded, "out": out.tolist()}}))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["loaded"] == []
    torch.testing.assert_close(torch.tensor(report["out"]), expected)


def test_wrapped_net_is_saved_with_plain_keys(tmp_path, trained):
    net, _ = trained

    class Wrapper(torch.nn.Module):  # stands in for DistributedDataParallel
        def __init__(self, module):
            super().__init__()
            self.module = module

    path = save_checkpoint(tmp_path / "wrapped.pt", Wrapper(net))
    assert set(load_checkpoint(path)["state_dict"]) == set(net.state_dict())
    with pytest.raises(TypeError, match="EmbeddingNet"):
        save_checkpoint(tmp_path / "other.pt", torch.nn.Linear(2, 2))


def test_sha256_is_the_file_digest(trained):
    _, path = trained
    assert checkpoint_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(NearsightError, match="checkpoint not found"):
        checkpoint_sha256(path.parent / "missing.pt")


def test_missing_file_is_one_line_error(tmp_path):
    with pytest.raises(NearsightError, match=r"checkpoint not found: .*nothing\.pt"):
        load_embedding_net(tmp_path / "nothing.pt")


def test_truncated_file_is_one_line_error(tmp_path, trained):
    _, path = trained
    truncated = tmp_path / "truncated.pt"
    data = path.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(NearsightError) as caught:
        load_embedding_net(truncated)
    assert str(truncated) in str(caught.value)
    assert "not a readable nearsight checkpoint" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_garbage_and_foreign_files_are_one_line_errors(tmp_path):
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"\x00\x01 definitely not a checkpoint" * 10)
    with pytest.raises(NearsightError, match="garbage.pt: not a readable nearsight checkpoint"):
        load_checkpoint(garbage)

    plain_state_dict = tmp_path / "plain.pt"
    torch.save({"weight": torch.zeros(2)}, plain_state_dict)
    with pytest.raises(NearsightError, match="plain.pt: not a nearsight checkpoint"):
        load_checkpoint(plain_state_dict)

    future = tmp_path / "future.pt"
    torch.save({"format": "nearsight-checkpoint", "version": 99}, future)
    with pytest.raises(NearsightError, match="version 99 is newer"):
        load_checkpoint(future)


def test_weights_that_do_not_match_the_config(tmp_path, trained):
    net, path = trained
    payload = load_checkpoint(path)
    payload["model_spec"]["dim"] = 64  # head stored as 12-d
    bad = tmp_path / "bad.pt"
    torch.save(payload, bad)
    with pytest.raises(NearsightError, match="bad.pt: weights do not match the stored config"):
        load_embedding_net(bad)

    payload["model_spec"] = {"dim": 12, "colour": "red"}
    torch.save(payload, bad)
    with pytest.raises(NearsightError, match="bad model description: model spec: unknown"):
        load_embedding_net(bad)


def test_a_version_1_checkpoint_with_its_model_config_still_loads(tmp_path, trained):
    """Version 1 stored the network twice (model_config beside model_spec); it still loads,
    from model_config, as do files from before model_spec existed."""
    net, path = trained
    payload = load_checkpoint(path)
    payload["version"] = 1
    payload["model_config"] = net.config.to_dict()
    del payload["model_training"]
    for name, keep_spec in (("v1.pt", True), ("older.pt", False)):
        old = (
            dict(payload) if keep_spec else {k: v for k, v in payload.items() if k != "model_spec"}
        )
        torch.save(old, tmp_path / name)
        loaded = load_embedding_net(tmp_path / name)
        assert loaded.config == net.config
        for key, value in net.state_dict().items():
            assert torch.equal(loaded.state_dict()[key], value), key
