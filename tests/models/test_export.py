"""ONNX export (nearsight/models/export.py, `nearsight export`): one file, metadata, parity, dynamic N,
int8, and nothing half-written on failure.

One tiny model (ResNet-18 trunk, 32 px, dim 16) is exported once for the module, with int8;
the export path does not depend on the architecture."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torchvision
from PIL import Image

import nearsight.models.export as export_module
from nearsight.app.cli import main
from nearsight.core.errors import NearsightError
from nearsight.models.checkpoint import save_checkpoint
from nearsight.models.embedder import METADATA_KEYS, OnnxEmbedder, nearsight_version
from nearsight.models.embedding import EmbeddingConfig, EmbeddingNet
from nearsight.models.export import (
    default_int8_path,
    export_onnx,
    pick_calibration_paths,
    quantize_int8,
)
from nearsight.models.preprocess import test_transform as make_test_transform

SIZE, DIM, RESIZE = 32, 16, 40


def _make_checkpoint(folder: Path) -> tuple[EmbeddingNet, Path]:
    torch.manual_seed(0)
    net = EmbeddingNet(
        EmbeddingConfig(dim=DIM, image_size=SIZE, arch="resnet18", pooling="avgmax")
    ).eval()
    with torch.no_grad():  # BatchNorm statistics unlike a fresh build: folding must use them
        net.trunk.bn1.running_mean.add_(0.3)
        net.trunk.bn1.running_var.mul_(2.0)
        net.feature_norm.running_mean.uniform_(0.0, 0.5)
        net.feature_norm.running_var.uniform_(0.5, 2.0)
        for block in net.trunk.modules():  # residual branches on, as in a trained net
            if isinstance(block, torchvision.models.resnet.BasicBlock):
                block.bn2.weight.fill_(1.0)
    path = save_checkpoint(
        folder / "best.pt",
        net,
        extra={
            "training": {
                "loss": "rankmi",
                "dataset": "cub",
                "step": 42,
                "metrics": {"recall@1": 0.25},
                "config": {"data": {"image_size": SIZE, "resize": RESIZE}},
            }
        },
    )
    return net, path


def _write_images(folder: Path, count: int, seed: int) -> list[Path]:
    """Smooth random images (blurred noise plus a colour ramp), like photographs more than
    white noise; varied sizes so the resize/crop is exercised."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        h, w = int(rng.integers(36, 64)), int(rng.integers(36, 64))
        coarse = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
        image = Image.fromarray(coarse).resize((w, h), Image.BILINEAR)
        path = folder / f"img{i:02d}.png"
        image.save(path)
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    net, checkpoint = _make_checkpoint(root / "run")
    calibration = _write_images(root / "calibration", 16, seed=1)
    out = root / "model" / "model.onnx"
    report = export_onnx(checkpoint, out, int8_calibration=calibration)
    yield {"net": net, "checkpoint": checkpoint, "out": out, "report": report, "root": root}
    shutil.rmtree(root, ignore_errors=True)


def _torch_embed(net: EmbeddingNet, images: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return net(torch.from_numpy(images)).numpy()


def test_report_parity_and_opset(exported):
    report = exported["report"]
    assert report.path == exported["out"]
    assert report.opset == 17 and report.exporter == "torchscript"
    assert report.parity_batches == (4, 1)
    assert 0.0 <= report.max_abs_diff <= 1e-4
    assert (report.dim, report.image_size, report.resize) == (DIM, SIZE, RESIZE)
    assert report.model_sha256 == hashlib.sha256(exported["out"].read_bytes()).hexdigest()
    assert report.size_bytes == exported["out"].stat().st_size


@pytest.mark.parametrize("batch", [1, 5])
def test_onnxruntime_matches_torch_for_any_batch_size(exported, batch):
    session = ort.InferenceSession(str(exported["out"]), providers=["CPUExecutionProvider"])
    images = np.random.default_rng(batch).random((batch, 3, SIZE, SIZE), dtype=np.float32)
    (got,) = session.run(["embeddings"], {"images": images})
    expected = _torch_embed(exported["net"], images)
    assert got.shape == (batch, DIM)
    assert np.abs(got - expected).max() <= 1e-4


def test_graph_signature_is_images_to_embeddings(exported):
    model = onnx.load(str(exported["out"]))
    (graph_input,) = model.graph.input
    (graph_output,) = model.graph.output
    assert graph_input.name == "images" and graph_output.name == "embeddings"
    assert graph_input.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    in_dims = graph_input.type.tensor_type.shape.dim
    assert in_dims[0].dim_param and not in_dims[0].dim_value  # dynamic N
    assert [d.dim_value for d in in_dims[1:]] == [3, SIZE, SIZE]
    out_dims = graph_output.type.tensor_type.shape.dim
    assert out_dims[0].dim_param and out_dims[1].dim_value == DIM
    assert model.opset_import[0].version == 17
    # BatchNorm is folded into the convolutions; the normalisation and L2 norm are in the graph
    ops = {node.op_type for node in model.graph.node}
    assert "BatchNormalization" not in ops
    # (adaptive max pooling becomes a MaxPool over the feature map: H and W are static)
    assert {"Sub", "Div", "ReduceL2", "GlobalAveragePool", "MaxPool"} <= ops


def test_metadata_props_describe_the_model(exported):
    model = onnx.load(str(exported["out"]))
    props = {p.key: p.value for p in model.metadata_props}
    assert set(METADATA_KEYS) <= set(props)
    checkpoint_bytes = exported["checkpoint"].read_bytes()
    assert props["format"] == "nearsight-embedding"
    spec = json.loads(props["model_spec"])  # the one description of the model
    assert spec["dim"] == DIM and spec["image_size"] == SIZE
    assert spec["test_resize"] == RESIZE  # the training config's, not the 256/224 default
    assert spec["heads"] == ["layer4"] and spec["embedding"] == "last"
    # no second copy of a spec field under its old name
    assert not {"embedding_dim", "image_size", "resize", "arch", "pooling"} & set(props)
    assert props["loss"] == "rankmi" and props["dataset"] == "cub"
    assert props["training_step"] == "42"
    assert props["checkpoint_sha256"] == hashlib.sha256(checkpoint_bytes).hexdigest()
    assert props["nearsight_version"] == nearsight_version()
    assert props["opset"] == "17" and props["precision"] == "fp32"
    assert spec["arch"] == "resnet18" and spec["pooling"] == "avgmax"


def test_one_file_without_external_data(exported):
    model_dir = exported["out"].parent
    assert sorted(p.name for p in model_dir.iterdir()) == ["model.int8.onnx", "model.onnx"]
    model = onnx.load(str(exported["out"]), load_external_data=False)
    assert model.graph.initializer
    assert all(t.data_location == onnx.TensorProto.DEFAULT for t in model.graph.initializer)
    assert sum(len(t.raw_data) for t in model.graph.initializer) > 1e6  # weights are inside


def test_output_is_l2_normalised_and_input_is_unnormalised_rgb(exported):
    embedder = OnnxEmbedder(exported["out"], providers=["CPUExecutionProvider"])
    images = np.random.default_rng(3).random((3, 3, SIZE, SIZE), dtype=np.float32)
    vectors = embedder.embed(images)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # ImageNet normalisation is inside: feeding pre-normalised pixels changes the output
    mean = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1)
    std = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1)
    assert np.abs(embedder.embed((images - mean) / std) - vectors).max() > 1e-2


def test_int8_model_is_close_to_fp32(exported):
    report = exported["report"]
    int8_path = exported["out"].with_name("model.int8.onnx")
    assert report.int8 is not None
    assert report.int8.path == int8_path == default_int8_path(exported["out"])
    assert report.int8.calibration_images == 16
    assert report.int8.cosine_min >= 0.9 and report.int8.cosine_mean >= report.int8.cosine_min
    assert report.int8.size_bytes < report.size_bytes / 3  # int8 weights
    flat = report.to_dict()
    assert flat["int8_path"] == str(int8_path) and flat["int8_calibration_images"] == 16
    model = onnx.load(str(int8_path))
    assert "QuantizeLinear" in {node.op_type for node in model.graph.node}
    props = {p.key: p.value for p in model.metadata_props}
    assert props["precision"] == "int8" and props["fp32_model_sha256"] == report.model_sha256
    # held-out images (not the calibration ones) through the shared preprocessing
    held_out = _write_images(exported["root"] / "held_out", 6, seed=7)
    transform = make_test_transform(SIZE, RESIZE)
    batch = torch.from_numpy(np.stack([transform(Image.open(p).convert("RGB")) for p in held_out]))
    fp32 = OnnxEmbedder(exported["out"], providers=["CPUExecutionProvider"]).embed(batch)
    int8 = OnnxEmbedder(int8_path, providers=["CPUExecutionProvider"]).embed(batch)
    assert np.sum(fp32 * int8, axis=1).min() >= 0.9


def test_quantize_int8_of_an_exported_model(exported, tmp_path):
    calibration = sorted((exported["root"] / "calibration").glob("*.png"))[:8]
    int8 = quantize_int8(exported["out"], tmp_path / "q.onnx", calibration)
    assert int8.path == tmp_path / "q.onnx" and int8.calibration_images == 8
    assert int8.cosine_min >= 0.9
    assert int8.model_sha256 == hashlib.sha256(int8.path.read_bytes()).hexdigest()
    embedder = OnnxEmbedder(int8.path, providers=["CPUExecutionProvider"])
    assert embedder.metadata["precision"] == "int8" and embedder.dim == DIM
    assert embedder.metadata["checkpoint_sha256"] == exported["report"].checkpoint_sha256
    with pytest.raises(NearsightError, match="already int8"):
        quantize_int8(int8.path, tmp_path / "qq.onnx", calibration)
    with pytest.raises(NearsightError, match="its own file"):
        quantize_int8(exported["out"], exported["out"], calibration)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.onnx"]


def test_failed_parity_check_leaves_no_file(exported, tmp_path, monkeypatch):
    out = tmp_path / "model.onnx"
    monkeypatch.setattr(export_module, "_parity", lambda *args, **kwargs: 0.5)
    with pytest.raises(NearsightError, match="parity") as error:
        export_onnx(exported["checkpoint"], out)
    assert "\n" not in str(error.value)
    assert list(tmp_path.iterdir()) == []  # neither model.onnx nor a temporary file


def test_failed_export_keeps_the_previous_model(exported, tmp_path, monkeypatch):
    out = tmp_path / "model.onnx"
    out.write_bytes(b"previous model")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(export_module, "_finish_model", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export_onnx(exported["checkpoint"], out)
    assert [p.name for p in tmp_path.iterdir()] == ["model.onnx"]
    assert out.read_bytes() == b"previous model"


def test_bad_inputs_are_one_line_errors(exported, tmp_path):
    checkpoint = exported["checkpoint"]
    with pytest.raises(NearsightError, match="checkpoint not found"):
        export_onnx(tmp_path / "missing.pt", tmp_path / "m.onnx")
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint at all")
    with pytest.raises(NearsightError, match="garbage.pt"):
        export_onnx(garbage, tmp_path / "m.onnx")
    with pytest.raises(NearsightError, match="opset"):
        export_onnx(checkpoint, tmp_path / "m.onnx", opset=9)
    with pytest.raises(NearsightError, match="calibration images"):
        export_onnx(checkpoint, tmp_path / "m.onnx", int8_calibration=[])
    with pytest.raises(NearsightError, match="could be read"):
        export_onnx(checkpoint, tmp_path / "m.onnx", int8_calibration=[garbage])
    assert not (tmp_path / "m.onnx").exists()


def test_pick_calibration_paths_spreads_over_the_list():
    paths = [Path(f"{i}.png") for i in range(10)]
    assert pick_calibration_paths(paths, 4) == [
        Path("0.png"),
        Path("2.png"),
        Path("5.png"),
        Path("7.png"),
    ]
    assert pick_calibration_paths(paths, 20) == paths


def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def test_cli_exports_a_run_dir_and_prints_parity(exported, tmp_path):
    out = tmp_path / "cli.onnx"
    code, stdout, stderr = _cli(
        ["export", "--checkpoint", str(exported["checkpoint"].parent), "--out", str(out)]
    )
    assert code == 0
    assert "exporting" in stderr and "parity check" in stderr  # stage lines on stderr
    assert "opset 17" in stdout and "max |torch - onnxruntime| = " in stdout
    parity = float(stdout.split("max |torch - onnxruntime| = ")[1].split()[0])
    assert 0 <= parity <= 1e-4
    assert OnnxEmbedder(out, providers=["CPUExecutionProvider"]).dim == DIM


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--checkpoint", "{tmp}/missing.pt", "--out", "{tmp}/m.onnx"], "checkpoint not found"),
        (["--checkpoint", "{ckpt}", "--out", "{tmp}/m.bin"], "must be a .onnx file"),
        (["--checkpoint", "{ckpt}", "--out", "{tmp}/m.onnx", "--int8"], "needs calibration"),
        (
            ["--checkpoint", "{ckpt}", "--out", "{tmp}/m.onnx", "--calibration-root", "{tmp}"],
            "only apply with --int8",
        ),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(exported, tmp_path, argv, message):
    argv = [a.format(tmp=tmp_path, ckpt=exported["checkpoint"]) for a in argv]
    code, stdout, stderr = _cli(["export", *argv])
    assert code == 2 and stdout == ""
    assert stderr.count("\n") == 1 and message in stderr
    assert not (tmp_path / "m.onnx").exists()
