"""Zero-shot galleries of a timm model in one command (``nearsight index build --model
timm:NAME``) and one call (``nearsight.build_gallery(model="timm:NAME")``): the pretrained
weights from a Hugging Face cache written on disk, offline; exported once beside the gallery;
searched from the CLI and from Python."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import TIMM_VIT, assert_one_line_error, run, write_hub_weights
from PIL import Image

import nearsight
from nearsight.data.datasets.synthetic import write_synthetic
from nearsight.index.gallery.core import Gallery
from nearsight.models import preprocess
from nearsight.models.timm_trunk import timm_model
from nearsight.models.timm_weights import read_weights_file

VIT_REPO = "timm/test_vit.r160_in1k"
BUILD = ["--dataset", "folder", "--split", "all", "--workers", "0"]


@pytest.fixture()
def hub(hf_cache) -> Path:
    """The cache holding test_vit's 'pretrained' weights (random, seeded); their file."""
    torch.manual_seed(11)
    model, _ = timm_model("test_vit", 160, pretrained=False)
    model.reset_classifier(1000)
    return write_hub_weights(hf_cache, VIT_REPO, model.state_dict())


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("zero-shot") / "data"
    write_synthetic(root, classes=4, per_class=3, size=48, seed=2)
    return root


def pretrained_features(weights: Path, image: Path) -> np.ndarray:
    """What timm's own test_vit (160 px, these weights) gives one image: its class token
    after the final norm, L2-normalised; preprocessed by its pretrained config (resize
    floor(160 / 0.95) = 168 bicubic, centre crop 160, mean and std 0.5)."""
    model, _ = timm_model("test_vit", 160, pretrained=False)
    state = read_weights_file(weights)
    model.load_state_dict({k: v for k, v in state.items() if not k.startswith("head.")})
    with Image.open(image) as opened:
        pixels = preprocess.test_transform(160, 168, "bicubic")(opened.convert("RGB"))
    x = (torch.from_numpy(pixels)[None] - 0.5) / 0.5
    with torch.no_grad():
        features = model.forward_head(model.forward_features(x), pre_logits=True)
    return F.normalize(features, dim=1)[0].numpy()


def test_index_build_with_a_timm_model_end_to_end(hub, data, tmp_path, capsys):
    out = tmp_path / "gallery"
    code, printed, err = run(capsys, "index", "build", "--model", TIMM_VIT, "--pretrained",
                             "hub", *BUILD, "--root", data, "--out", out)  # fmt: skip
    assert code == 0, err
    assert "built gallery" in printed and "exporting timm:test_vit" in err
    exported = sorted((tmp_path / "nearsight-models").glob("timm-test_vit-*.onnx"))
    assert len(exported) == 1
    with Gallery.open(out) as gallery:
        assert Path(gallery.meta["model"]) == exported[0]
        spec = gallery.meta["model_spec"]
        assert (spec["head"], spec["dim"], spec["pooling"]) == ("none", 64, "token")
        assert (spec["image_size"], spec["test_resize"], spec["interpolation"]) == (
            160, 168, "bicubic",
        )  # fmt: skip
        items = gallery.all_items()
        first = next(item for item in items if item["id"] == gallery.ids[0])
        vector = gallery.embeddings[0]
    # the gallery holds the pretrained model's own features of each image
    expected = pretrained_features(hub, Path(first["path"]))
    assert np.abs(vector - expected).max() < 1e-4

    # searched from the command line: each image finds itself first
    code, printed, err = run(capsys, "search", "--gallery", out, first["path"], "--k", "3",
                             "--json")  # fmt: skip
    assert code == 0, err
    hits = json.loads(printed)
    assert hits[0]["path"] == first["path"] and hits[0]["distance"] == pytest.approx(0, abs=1e-3)

    # a second gallery from the same model reuses the export
    code, _, err = run(capsys, "index", "build", "--model", TIMM_VIT, *BUILD, "--root", data,
                       "--out", tmp_path / "again")  # fmt: skip
    assert code == 0, err
    assert "reusing" in err and "exporting" not in err
    assert sorted((tmp_path / "nearsight-models").glob("*.onnx")) == exported

    # ... without importing timm or torch (1.9 GB resident against 0.5 GB), in a fresh process
    argv = [str(a) for a in ["index", "build", "--model", TIMM_VIT, *BUILD, "--root", data,
                             "--out", tmp_path / "third"]]  # fmt: skip
    code = (
        f"import sys\nfrom nearsight.app.cli import main\nstatus = main({argv!r})\n"
        "print(sorted(m for m in ('torch', 'timm') if m in sys.modules))\nsys.exit(status)"
    )
    third = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert third.returncode == 0, third.stderr
    assert third.stdout.strip().splitlines()[-1] == "[]" and "reusing" in third.stderr
    with Gallery.open(tmp_path / "third") as gallery:
        assert Path(gallery.meta["model"]) == exported[0]

    # a touched weights file is not trusted by its record: the long way hashes it again
    os.utime(hub, ns=(hub.stat().st_atime_ns, hub.stat().st_mtime_ns + 10**9))
    code, _, err = run(capsys, "index", "build", "--model", TIMM_VIT, *BUILD, "--root", data,
                       "--out", tmp_path / "fourth")  # fmt: skip
    assert code == 0 and "reusing" in err, err  # same bytes: the same export, found by hash


def test_build_gallery_from_python(hub, data, tmp_path):
    out = tmp_path / "python"
    with nearsight.build_gallery(
        "timm:test_vit", out, dataset="folder", root=data, split="all", pretrained="hub"
    ) as gallery:
        assert len(gallery) == 12 and gallery.gallery.meta["model_spec"]["head"] == "none"
        image = sorted(data.rglob("*.png"))[5]
        (hit,) = gallery.search(image, k=1)
        assert Path(hit["path"]) == image and hit["distance"] == pytest.approx(0, abs=1e-3)


def test_random_weights_at_a_chosen_size_and_pooling(hf_cache, data, tmp_path, capsys):
    out = tmp_path / "random"
    code, _, err = run(capsys, "index", "build", "--model", TIMM_VIT, "--pretrained", "none",
                       "--input-size", "32", "--pooling", "avg", *BUILD, "--root", data,
                       "--out", out)  # fmt: skip
    assert code == 0, err
    with Gallery.open(out) as gallery:
        spec = gallery.meta["model_spec"]
        assert (spec["image_size"], spec["pooling"], spec["dim"]) == (32, "avg", 64)


def test_an_empty_cache_offline_is_one_line_and_writes_nothing(hf_cache, data, tmp_path, capsys):
    out = tmp_path / "none"
    code, _, err = run(capsys, "index", "build", "--model", TIMM_VIT, *BUILD, "--root", data,
                       "--out", out)  # fmt: skip
    assert_one_line_error(code, err, "timm:test_vit", str(hf_cache), f"hf download {VIT_REPO}")
    assert not out.exists() and not (tmp_path / "nearsight-models").exists()


def test_foreign_model_options_are_refused_for_a_timm_model(hf_cache, data, tmp_path, capsys):
    code, _, err = run(capsys, "index", "build", "--model", TIMM_VIT, "--mean", "0.5", "0.5",
                       "0.5", *BUILD, "--root", data, "--out", tmp_path / "bad")  # fmt: skip
    assert_one_line_error(code, err, "--mean: for a model exported elsewhere, not timm:NAME")


def test_timm_options_need_a_timm_model(onnx_gallery, tmp_path, capsys):
    code, _, err = run(capsys, "index", "build", "--model", onnx_gallery.model, "--pretrained",
                       "hub", *BUILD, "--root", onnx_gallery.data, "--out", tmp_path / "g")  # fmt: skip
    assert_one_line_error(code, err, "--pretrained and --pooling go with --model timm:NAME")
