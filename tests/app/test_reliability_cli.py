"""Bad input across the whole CLI: wrong dataset layouts, unreadable and absurd image files,
foreign and broken models, a model that is not the gallery's, damaged gallery files, bad
settings. Every case must end with ONE line `nearsight: error: ...` on stderr, exit status 2,
no traceback (an exception escaping `main` fails the test), and nothing half-written.

tests/app/test_index_cli.py, tests/models/test_export.py, tests/training/test_trainer.py and tests/data/test_datasets.py
already check the first bad inputs of each command (missing gallery, garbage JPEG, missing
model, a different model, one wrong train layout, unknown loss); these tests add the rest."""

from __future__ import annotations

import io
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from helpers import FAST, assert_one_line_error, run
from onnx import TensorProto, helper
from PIL import Image

from nearsight.app.cli import main
from nearsight.data.datasets import load_dataset
from nearsight.data.datasets.synthetic import write_synthetic
from nearsight.index.gallery.core import Gallery
from nearsight.models.checkpoint import save_checkpoint
from nearsight.models.embedding import EmbeddingConfig, build_embedding_net

DATASETS = ["cub", "cars", "sop", "folder", "csv"]


# -- helpers ----------------------------------------------------------------------------------


def tiny_checkpoint(path: Path, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    net = build_embedding_net(EmbeddingConfig(dim=16, image_size=32, arch="resnet18"))
    return save_checkpoint(path, net)


def tree_state(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too) and its bytes."""
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def png_with_header(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims ``width`` x ``height`` (valid CRCs), with a few bytes of data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\x00" * 16))
        + chunk(b"IEND", b"")
    )


def onnx_model(path: Path, nodes, output_shape, *, tagged: bool, initializers=()) -> Path:
    """A small ONNX graph images[N,3,32,32] -> embeddings; ``tagged``: with the metadata of a
    nearsight model (so only its output can give it away)."""
    graph = helper.make_graph(
        nodes,
        "foreign",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, output_shape)],
        initializer=list(initializers),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if tagged:
        tags = {"format": "nearsight-embedding", "format_version": "1", "embedding_dim": "16"}
        for key, value in {**tags, "image_size": "32"}.items():
            prop = model.metadata_props.add()
            prop.key, prop.value = key, value
    onnx.save(model, str(path))
    return path


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("reliability-cli")
    data = root / "data"
    write_synthetic(data, classes=6, per_class=4, size=32)
    model = tiny_checkpoint(root / "model.pt")
    gallery = root / "gallery"
    argv = ["index", "build", "--model", str(model), "--dataset", "folder", "--root", str(data)]
    assert main([*argv, "--out", str(gallery), *FAST]) == 0
    query = load_dataset("folder", data, "test").paths[0]

    bad = root / "bad"
    bad.mkdir()
    jpeg, png = io.BytesIO(), io.BytesIO()
    photo = Image.open(query).convert("RGB")
    photo.save(jpeg, format="JPEG", quality=90)
    photo.save(png, format="PNG")
    files = {
        "empty.jpg": b"",
        "text.jpg": b"this is a text file with an image name\n",
        "truncated.jpg": jpeg.getvalue()[: len(jpeg.getvalue()) // 2],
        "truncated.png": png.getvalue()[: len(png.getvalue()) // 2],
        "zero-size.png": png_with_header(0, 0),
        "bomb.png": png_with_header(100_000, 100_000),  # 10 gigapixels in 100 bytes
        "too-wide.png": png_with_header(2**31 - 1, 1),
        "zeros-8mb.png": bytes(8 * 1024 * 1024),  # big and not an image: read by its header
    }
    for name, content in files.items():
        (bad / name).write_bytes(content)
    return {"root": root, "data": data, "model": model, "gallery": gallery, "query": query,
            "bad": bad, "bad_files": sorted(bad / name for name in files)}  # fmt: skip


@pytest.fixture
def gallery_copy(setup, tmp_path) -> Path:
    copy = tmp_path / "gallery"
    shutil.copytree(setup["gallery"], copy)
    return copy


# -- dataset layouts --------------------------------------------------------------------------


@pytest.mark.parametrize("dataset", DATASETS)
def test_wrong_dataset_layouts_are_one_line_and_write_nothing(setup, tmp_path, capsys, dataset):
    empty = tmp_path / "empty"
    empty.mkdir()
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a dataset\n")
    for root in (empty, a_file, tmp_path / "missing"):
        code, _, err = run(capsys, "index", "build", "--model", setup["model"], "--dataset",
                           dataset, "--root", root, "--out", tmp_path / "g", *FAST)  # fmt: skip
        assert_one_line_error(code, err, str(root))
        code, _, err = run(capsys, "train", "--dataset", dataset, "--root", root, "--loss", "ice",
                           "--out", tmp_path / "run", "--image-size", "32")  # fmt: skip
        assert_one_line_error(code, err, str(root))
    # a refused run leaves no run folder (it used to leave one holding only config.yaml)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "notes.txt"]


def test_bad_training_settings_are_refused_before_a_run_folder_exists(setup, tmp_path, capsys):
    binary_config = tmp_path / "config.yaml"
    binary_config.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    config_folder = tmp_path / "configs"
    config_folder.mkdir()
    weights = tmp_path / "weights.pth"
    weights.write_bytes(b"not torch weights")
    occupied = tmp_path / "occupied"
    occupied.write_text("a file where the run folder should go")
    common = ["--dataset", "folder", "--root", setup["data"], "--loss", "ice", "--image-size",
              "32", "--dim", "16", "--classes-per-batch", "3", "--per-class", "2", "--steps",
              "1", *FAST]  # fmt: skip
    cases = [
        (["--classes-per-batch", "99"], "99 classes per batch"),
        (["--set", "eval_every=0"], "eval_every must be a positive integer"),
        (["--set", "save_every=0"], "save_every must be a positive integer"),
        (["--set", "log_every=0"], "log_every must be a positive integer"),
        (["--set", "data.eval_batch_size=0"], "data.eval_batch_size must be a positive"),
        (["--workers", "-1"], "data.workers must be 0 or more"),
        (["--dim", "0"], "embedding dim must be a positive integer"),
        (["--config", binary_config], "is not UTF-8 text"),
        (["--config", config_folder], "cannot read config file"),
        (["--pretrained", weights], str(weights)),
    ]
    for extra, fragment in cases:
        code, _, err = run(capsys, "train", *common, *extra, "--out", tmp_path / "run")
        assert_one_line_error(code, err, fragment)
        assert not (tmp_path / "run").exists(), extra
    code, _, err = run(capsys, "train", *common, "--out", occupied)
    assert_one_line_error(code, err, f"--out {occupied} is a file")
    code, _, err = run(capsys, "demo", "--workdir", occupied, "--no-launch")
    assert_one_line_error(code, err, f"--workdir {occupied} is a file")
    assert occupied.read_text() == "a file where the run folder should go"


# -- image files ------------------------------------------------------------------------------


def test_unreadable_and_absurd_query_images(setup, capsys):
    reasons = {
        "empty.jpg": "the file is empty",
        "text.jpg": "not an image file",
        "truncated.jpg": "truncated",
        "truncated.png": "truncated",
        "zero-size.png": "cannot read image",
        "bomb.png": "decompression bomb",
        "too-wide.png": "decompression bomb",
        "zeros-8mb.png": "not an image file",
    }
    for path in setup["bad_files"]:
        code, out, err = run(capsys, "search", "--gallery", setup["gallery"], path)
        assert_one_line_error(code, err, f"cannot read image {path}", reasons[path.name])
        assert out == ""
    code, _, err = run(capsys, "search", "--gallery", setup["gallery"], setup["bad"])
    assert_one_line_error(code, err, "it is a folder, not an image file")


def test_an_add_of_only_unreadable_images_changes_nothing(setup, gallery_copy, capsys):
    before = tree_state(gallery_copy)
    code, _, err = run(capsys, "index", "add", "--gallery", gallery_copy, *setup["bad_files"],
                       "--label", "3", *FAST)  # fmt: skip
    assert_one_line_error(code, err, "no image could be read")
    skipped = [line for line in err.splitlines() if line.startswith("nearsight: skipped:")]
    assert len(skipped) == len(setup["bad_files"])
    assert tree_state(gallery_copy) == before
    assert sorted(p.name for p in gallery_copy.parent.iterdir()) == [".gallery.lock", "gallery"]


def test_unreadable_images_among_good_ones_are_skipped_by_add(setup, gallery_copy, capsys):
    good = load_dataset("folder", setup["data"], "train").paths[:2]
    code, out, err = run(capsys, "index", "add", "--gallery", gallery_copy, good[0],
                         *setup["bad_files"], good[1], *FAST)  # fmt: skip
    assert code == 0, err
    assert f"added 2 items (ids 12, 13), {len(setup['bad_files'])} unreadable skipped" in out
    with Gallery.open(gallery_copy) as gallery:
        assert [row["path"] for row in gallery.items([12, 13])] == [str(p) for p in good]


def test_absurd_k_is_clamped_to_the_gallery(setup, capsys):
    code, out, err = run(capsys, "search", "--gallery", setup["gallery"], setup["query"],
                         "--k", str(10**20), "--json")  # fmt: skip
    assert code == 0, err
    assert out.count('"id"') == 12  # every item once, not an error or a 10^20 allocation
    code, out, err = run(capsys, "eval", "--gallery", setup["gallery"], "--k", "1", str(10**20))
    assert code == 0, err
    assert "recall@1 " in out and "recall@100000000000000000000 1.0000" in out


# -- models -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def foreign_models(setup) -> dict[str, Path]:
    folder = setup["root"] / "foreign"
    folder.mkdir()
    identity = [helper.make_node("Identity", ["images"], ["embeddings"])]
    flatten_slice = [
        helper.make_node("Reshape", ["images", "shape"], ["flat"]),
        helper.make_node("Slice", ["flat", "starts", "ends", "axes"], ["embeddings"]),
    ]
    constants = [
        helper.make_tensor("shape", TensorProto.INT64, [2], [0, -1]),
        helper.make_tensor("starts", TensorProto.INT64, [1], [0]),
        helper.make_tensor("ends", TensorProto.INT64, [1], [16]),
        helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
    ]
    models = {
        # an ONNX model, but not nearsight's: no metadata
        "plain.onnx": onnx_model(folder / "plain.onnx", identity, ["N", 3, 32, 32], tagged=False),
        # tagged as nearsight's, but its output is images, not [N, 16]
        "wrong-shape.onnx": onnx_model(
            folder / "wrong-shape.onnx", identity, ["N", 3, 32, 32], tagged=True
        ),
        # tagged, [N, 16], but pixel values rather than unit vectors
        "unnormalised.onnx": onnx_model(
            folder / "unnormalised.onnx",
            flatten_slice,
            ["N", 16],
            tagged=True,
            initializers=constants,
        ),  # fmt: skip
    }
    garbage = folder / "garbage.onnx"
    garbage.write_bytes(np.random.default_rng(0).bytes(512))
    models["garbage.onnx"] = garbage
    not_a_model = folder / "weights.txt"
    not_a_model.write_text("hello")
    models["weights.txt"] = not_a_model
    return models


def test_foreign_models_are_refused_by_every_command(setup, foreign_models, tmp_path, capsys):
    reasons = {
        "plain.onnx": "no format=nearsight-embedding",
        "wrong-shape.onnx": "its output has shape [12, 3, 32, 32], not [12, 16]",
        "unnormalised.onnx": "its output has vectors that are not L2-normalised",
        "garbage.onnx": "onnxruntime cannot read it",
        "weights.txt": "expected a .onnx file",
    }
    before = tree_state(setup["gallery"])
    for name, model in foreign_models.items():
        out = tmp_path / name
        code, _, err = run(capsys, "index", "build", "--model", model, "--dataset", "folder",
                           "--root", setup["data"], "--out", out, *FAST)  # fmt: skip
        assert_one_line_error(code, err, str(model), reasons[name])
        assert not out.exists()
        # as the model of an existing gallery: refused before (or as) it embeds anything
        for argv in (["search", "--gallery", setup["gallery"], setup["query"]],
                     ["index", "add", "--gallery", setup["gallery"], setup["query"], *FAST]):  # fmt: skip
            code, _, err = run(capsys, *argv, "--model", model)
            line = assert_one_line_error(code, err, str(model))
            assert "not a nearsight model" in line or "was built with model sha256" in line
    assert tree_state(setup["gallery"]) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_checkpoint_with_nan_weights_is_refused_not_indexed(setup, tmp_path, capsys):
    torch.manual_seed(0)
    net = build_embedding_net(EmbeddingConfig(dim=16, image_size=32, arch="resnet18"))
    with torch.no_grad():
        net.embedding.weight.fill_(float("nan"))  # what a diverged training run leaves
    broken = save_checkpoint(tmp_path / "diverged.pt", net)
    code, _, err = run(capsys, "index", "build", "--model", broken, "--dataset", "folder",
                       "--root", setup["data"], "--out", tmp_path / "g", *FAST)  # fmt: skip
    assert_one_line_error(code, err, str(broken), "NaN or infinite values")
    code, _, err = run(capsys, "export", "--checkpoint", broken, "--out", tmp_path / "m.onnx")
    assert_one_line_error(code, err, str(broken), "NaN or infinite embeddings", "nothing written")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["diverged.pt"]


def test_a_model_replaced_at_the_recorded_path_is_refused(setup, tmp_path, capsys):
    """The gallery records its model's path; retraining and exporting over that path must not
    silently mix two embedding spaces."""
    model = tiny_checkpoint(tmp_path / "model.pt", seed=0)
    gallery = tmp_path / "g"
    code, _, err = run(capsys, "index", "build", "--model", model, "--dataset", "folder",
                       "--root", setup["data"], "--out", gallery, *FAST)  # fmt: skip
    assert code == 0, err
    tiny_checkpoint(model, seed=1)  # "retrained", written over the same file
    before = tree_state(gallery)
    for argv in (["search", "--gallery", gallery, setup["query"]],
                 ["index", "add", "--gallery", gallery, setup["query"], *FAST]):  # fmt: skip
        code, _, err = run(capsys, *argv)
        assert_one_line_error(code, err, "was built with model sha256", f"but {model} is")
    assert tree_state(gallery) == before
    model.unlink()
    code, _, err = run(capsys, "search", "--gallery", gallery, setup["query"])
    assert_one_line_error(code, err, f"is not at {model} any more: pass --model")


# -- damaged galleries ------------------------------------------------------------------------


def _truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


DAMAGES = {
    "catalog-truncated": (lambda g: _truncate(g / "catalog.db", 3000), "catalog.db is damaged"),
    "catalog-empty": (lambda g: (g / "catalog.db").write_bytes(b""), "no 'items' table"),
    "index-garbage": (
        lambda g: (g / "index.faiss").write_bytes(b"garbage" * 20),
        "not a readable FAISS index",
    ),
    "embeddings-truncated": (
        lambda g: _truncate(g / "embeddings.npy", 200),
        "not a readable embeddings file",
    ),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_damaged_gallery_files_are_one_line_for_every_command(setup, tmp_path, capsys, damage):
    gallery = tmp_path / "g"
    shutil.copytree(setup["gallery"], gallery)
    spoil, reason = DAMAGES[damage]
    spoil(gallery)
    before = tree_state(gallery)
    for argv in (["search", "--gallery", gallery, setup["query"]],
                 ["eval", "--gallery", gallery],
                 ["index", "add", "--gallery", gallery, setup["query"], *FAST],
                 ["index", "remove", "--gallery", gallery, "--ids", "0"],
                 ["serve", "--gallery", gallery, "--port", "0", "--device", "cpu"]):  # fmt: skip
        code, out, err = run(capsys, *argv)
        assert_one_line_error(code, err, reason)
        assert out == ""
    assert tree_state(gallery) == before  # nothing "repaired" behind the user's back


def test_serve_names_a_bad_host_instead_of_blaming_the_port(setup, capsys):
    code, _, err = run(capsys, "serve", "--gallery", setup["gallery"], "--host", "999.1.1.1",
                       "--port", "0")  # fmt: skip
    assert_one_line_error(code, err, "cannot serve on 999.1.1.1:0: unknown host")
    assert "port is in use" not in err and "ERROR" not in err
    # 192.0.2.1 is TEST-NET-1 (RFC 5737): never an address of this machine
    code, _, err = run(capsys, "serve", "--gallery", setup["gallery"], "--host", "192.0.2.1",
                       "--port", "0")  # fmt: skip
    assert_one_line_error(code, err, "cannot serve on 192.0.2.1:0: Cannot assign requested")
