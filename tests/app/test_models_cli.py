"""``nearsight models``: the timm models the Hugging Face cache holds, torch.hub's weights, ONNX
files given by path and the galleries' models, offline; one line on how to get a model where
there is none."""

from __future__ import annotations

import json
import os

from helpers import run


def _caches(tmp_path, monkeypatch):
    hub, torch_home = tmp_path / "hf", tmp_path / "torch"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("TORCH_HOME", str(torch_home))
    return hub, torch_home


def test_no_model_here_says_how_to_get_one(tmp_path, monkeypatch, capsys):
    _caches(tmp_path, monkeypatch)
    code, out, err = run(capsys, "models")
    assert code == 0 and err == ""
    assert out.count("\n") == 1 and out.startswith("no model here")
    for way in ("timm/", "ONNX", "nearsight train"):
        assert way in out


def test_models_lists_cached_timm_torch_hub_onnx_and_gallery_models(
    tmp_path, monkeypatch, capsys, onnx_gallery
):
    hub, torch_home = _caches(tmp_path, monkeypatch)
    repo = hub / "models--timm--resnet50.a1_in1k"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "abc").write_bytes(b"weights")
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    os.symlink(os.path.relpath(repo / "blobs" / "abc", snapshot), snapshot / "model.safetensors")
    partial = hub / "models--timm--vit_tiny" / "snapshots" / "1"  # a dangling link: not listed
    partial.mkdir(parents=True)
    os.symlink("../../blobs/missing", partial / "model.safetensors")
    (torch_home / "hub" / "checkpoints").mkdir(parents=True)
    (torch_home / "hub" / "checkpoints" / "resnet50-0676ba61.pth").write_bytes(b"w")
    broken = tmp_path / "broken.onnx"
    broken.write_text("not a model")
    code, out, err = run(capsys, "models", onnx_gallery.model, broken, "--gallery",
                         onnx_gallery.gallery, "--json")  # fmt: skip
    assert code == 0, err
    found = {(m["kind"], m["name"]): m for m in json.loads(out)}
    assert ("timm", "timm:resnet50.a1_in1k") in found and ("timm", "timm:vit_tiny") not in found
    assert found[("torch-hub", "resnet50")]["use"].endswith("--pretrained imagenet ...")
    model = found[("onnx", str(onnx_gallery.model))]
    assert model["usable"] and model["facts"] == {"dim": 8, "image_size": 32, "arch": "resnet18"}
    assert not found[("onnx", str(broken))]["usable"]
    recorded = [m for m in found.values() if m["kind"] == "gallery"]
    assert len(recorded) == 1 and recorded[0]["usable"]
    assert os.path.samefile(recorded[0]["name"], onnx_gallery.model)
    code, out, _ = run(capsys, "models", tmp_path)  # a folder: its ONNX files
    assert code == 0 and "broken.onnx  (not usable)" in out and "no model here" not in out
