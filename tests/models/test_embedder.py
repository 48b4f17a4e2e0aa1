"""Embedder runtimes (nearsight/models/embedder.py): ONNX and torch agree through the shared
preprocessing, metadata and hashes, provider choice, and one-line errors for foreign files.

One tiny model (ResNet-18 trunk, 32 px, dim 16) is saved and exported once for the module."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from PIL import Image

import nearsight.models.onnx_session as onnx_session
from nearsight.core.errors import NearsightError
from nearsight.models.checkpoint import save_checkpoint
from nearsight.models.embedder import Embedder, OnnxEmbedder, default_providers, physical_cores
from nearsight.models.embedding import EmbeddingConfig, EmbeddingNet
from nearsight.models.export import export_onnx
from nearsight.models.loading import load_embedder
from nearsight.models.preprocess import test_transform as make_test_transform
from nearsight.models.torch_embedder import TorchEmbedder

SIZE, DIM = 32, 16
RESIZE = round(SIZE * 256 / 224)  # the checkpoint has no training config: the default ratio
CPU = ["CPUExecutionProvider"]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Iterator[dict[str, Path]]:
    root = tmp_path_factory.mktemp("embedder")
    torch.manual_seed(1)
    net = EmbeddingNet(EmbeddingConfig(dim=DIM, image_size=SIZE, arch="resnet18")).eval()
    checkpoint = save_checkpoint(root / "best.pt", net)
    onnx_path = root / "model.onnx"
    export_onnx(checkpoint, onnx_path)
    yield {"checkpoint": checkpoint, "onnx": onnx_path, "root": root}
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def onnx_embedder(models) -> OnnxEmbedder:
    return OnnxEmbedder(models["onnx"], providers=CPU)


@pytest.fixture(scope="module")
def torch_embedder(models) -> TorchEmbedder:
    """fp32, for parity with the ONNX model (the bf16 choice is tested below)."""
    return TorchEmbedder(models["checkpoint"], device="cpu", amp=False, channels_last=False)


def test_the_torch_embedder_takes_the_hardware_choice_and_stays_close_in_bf16(
    models, torch_embedder, monkeypatch
):
    from nearsight.models import hardware

    monkeypatch.setattr(hardware, "cpu_flags", lambda cpuinfo=None: {"avx512f", "amx_bf16"})
    fast = TorchEmbedder(models["checkpoint"], device="cpu")
    assert (fast.amp, fast.channels_last) == (True, True)
    assert "native bf16" in fast.precision_note
    monkeypatch.setattr(hardware, "cpu_flags", lambda cpuinfo=None: {"avx512f", "avx2"})
    plain = TorchEmbedder(models["checkpoint"], device="cpu")
    assert (plain.amp, plain.channels_last) == (False, False)
    photos = _photos()
    bf16, fp32 = fast.embed_images(photos), torch_embedder.embed_images(photos)
    np.testing.assert_allclose(np.linalg.norm(bf16, axis=1), 1.0, atol=1e-5)
    assert (bf16 * fp32).sum(axis=1).min() >= 0.999  # cosine to the fp32 vectors


def _photos() -> list[Image.Image]:
    """Images of different sizes and modes (RGB, L, RGBA): preprocessing must resize, crop and
    convert them all the same way in both runtimes."""
    rng = np.random.default_rng(0)
    images = []
    for h, w in [(40, 60), (64, 48), (37, 37), (90, 50)]:
        coarse = rng.integers(0, 256, (5, 5, 3), dtype=np.uint8)
        images.append(Image.fromarray(coarse).resize((w, h), Image.BILINEAR))
    images.append(images[0].convert("L"))
    images.append(images[1].convert("RGBA"))
    return images


def test_onnx_and_torch_agree_on_pil_images(onnx_embedder, torch_embedder):
    photos = _photos()
    from_onnx = onnx_embedder.embed_images(photos, batch_size=4)  # two batches: 4 + 2
    from_torch = torch_embedder.embed_images(photos)
    assert from_onnx.shape == from_torch.shape == (len(photos), DIM)
    assert from_onnx.dtype == from_torch.dtype == np.float32
    assert np.abs(from_onnx - from_torch).max() <= 1e-4
    np.testing.assert_allclose(np.linalg.norm(from_onnx, axis=1), 1.0, atol=1e-5)
    assert np.abs(from_onnx[0] - from_onnx[1]).max() > 1e-3  # different images, different vectors


def test_embed_images_is_the_shared_test_transform(onnx_embedder, torch_embedder):
    photos = _photos()[:3]
    transform = make_test_transform(SIZE, RESIZE)
    batch = torch.from_numpy(np.stack([transform(photo.convert("RGB")) for photo in photos]))
    for embedder in (onnx_embedder, torch_embedder):
        assert (embedder.image_size, embedder.resize) == (SIZE, RESIZE)
        np.testing.assert_array_equal(embedder.embed_images(photos), embedder.embed(batch))


def test_embed_takes_numpy_or_torch_and_any_batch_size(onnx_embedder, torch_embedder):
    images = np.random.default_rng(2).random((5, 3, SIZE, SIZE), dtype=np.float32)
    for embedder in (onnx_embedder, torch_embedder):
        from_numpy = embedder.embed(images)
        np.testing.assert_array_equal(from_numpy, embedder.embed(torch.from_numpy(images)))
        np.testing.assert_allclose(embedder.embed(images[:1]), from_numpy[:1], atol=1e-5)
        assert embedder.embed(images[:0]).shape == (0, DIM)
        assert embedder.embed_images([]).shape == (0, DIM)
        # float64 input is accepted and cast
        np.testing.assert_allclose(embedder.embed(images.astype(np.float64)), from_numpy, atol=1e-5)


def test_wrong_image_shape_is_a_one_line_error(onnx_embedder, torch_embedder):
    for embedder in (onnx_embedder, torch_embedder):
        with pytest.raises(NearsightError, match=rf"\[N, 3, {SIZE}, {SIZE}\].*\[2, 3, 64, 64\]"):
            embedder.embed(np.zeros((2, 3, 64, 64), np.float32))
        with pytest.raises(NearsightError, match="shape"):
            embedder.embed(np.zeros((3, SIZE, SIZE), np.float32))


def test_hashes_and_metadata(models, onnx_embedder, torch_embedder):
    onnx_sha = hashlib.sha256(models["onnx"].read_bytes()).hexdigest()
    checkpoint_sha = hashlib.sha256(models["checkpoint"].read_bytes()).hexdigest()
    # the model hash is the loaded FILE's: the .onnx for ONNX, the checkpoint for torch
    assert onnx_embedder.model_sha256 == onnx_sha
    assert torch_embedder.model_sha256 == checkpoint_sha
    # both know which checkpoint they come from
    assert onnx_embedder.metadata["checkpoint_sha256"] == checkpoint_sha
    assert torch_embedder.metadata["checkpoint_sha256"] == checkpoint_sha
    for embedder in (onnx_embedder, torch_embedder):
        assert embedder.dim == DIM
        assert embedder.spec.dim == DIM and embedder.spec.image_size == SIZE
        assert embedder.spec.test_resize == embedder.resize == RESIZE
        assert embedder.metadata["loss"] == "" and embedder.metadata["dataset"] == ""
        assert isinstance(embedder, Embedder)
    assert onnx_embedder.metadata["opset"] == "17"
    shared = set(torch_embedder.metadata)
    assert {k: onnx_embedder.metadata[k] for k in shared} == torch_embedder.metadata


def test_load_embedder_by_suffix(models, tmp_path):
    onnx_model = load_embedder(models["onnx"], device="cpu")
    assert isinstance(onnx_model, OnnxEmbedder) and onnx_model.providers == CPU
    assert isinstance(load_embedder(models["checkpoint"], device="cpu"), TorchEmbedder)
    with pytest.raises(NearsightError, match="model not found"):
        load_embedder(tmp_path / "missing.onnx")
    other = tmp_path / "model.bin"
    other.write_bytes(models["onnx"].read_bytes()[:100])
    with pytest.raises(NearsightError, match="model.bin is not a nearsight model"):
        load_embedder(other)
    with pytest.raises(NearsightError, match="device"):
        load_embedder(models["onnx"], device="tpu")


def _plain_onnx_model(path: Path) -> None:
    """A valid ONNX model with the right input and output names but no nearsight metadata."""
    node = helper.make_node("ReduceMean", ["images"], ["embeddings"], axes=[2, 3], keepdims=0)
    graph = helper.make_graph(
        [node],
        "plain",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, SIZE, SIZE])],
        [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["N", 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def test_foreign_files_are_not_nearsight_models(tmp_path, models):
    plain = tmp_path / "plain.onnx"
    _plain_onnx_model(plain)
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(os.urandom(256))
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(models["onnx"].read_bytes()[:5000])
    for path in (plain, garbage, truncated):
        with pytest.raises(NearsightError, match=f"{path.name} is not a nearsight model") as error:
            load_embedder(path, device="cpu")
        assert "\n" not in str(error.value)
    with pytest.raises(NearsightError, match="no format=nearsight-embedding"):
        OnnxEmbedder(plain, providers=CPU)
    not_checkpoint = tmp_path / "garbage.pt"
    not_checkpoint.write_bytes(b"\x00" * 64)
    with pytest.raises(NearsightError, match="garbage.pt"):
        load_embedder(not_checkpoint, device="cpu")


def test_provider_choice(monkeypatch):
    import onnxruntime as ort

    listed = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: listed)
    # onnxruntime-gpu lists CUDA on a machine without a GPU: only a working GPU counts
    monkeypatch.setattr(onnx_session, "_cuda_works", lambda: False)
    assert default_providers("auto") == CPU
    with pytest.raises(NearsightError, match="no working CUDA GPU"):
        default_providers("cuda")
    monkeypatch.setattr(onnx_session, "_cuda_works", lambda: True)
    assert default_providers("auto") == listed
    assert default_providers("cpu") == CPU


def test_device_cuda_is_refused_when_onnxruntime_cannot_use_it(models, monkeypatch):
    import onnxruntime as ort

    if OnnxEmbedder(models["onnx"]).device == "cuda":
        pytest.skip("a working GPU")
    monkeypatch.setattr(
        ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"]
    )
    monkeypatch.setattr(onnx_session, "_cuda_works", lambda: True)  # torch says yes...
    with pytest.raises(NearsightError, match="could not start its CUDA provider"):
        load_embedder(models["onnx"], device="cuda")  # ...onnxruntime ends up on the CPU
    assert load_embedder(models["onnx"], device="auto").device == "cpu"  # auto falls back


def test_gpu_provider_that_cannot_start_falls_back_to_cpu_quietly(models, capfd):
    if OnnxEmbedder(models["onnx"]).providers[0] != "CPUExecutionProvider":
        pytest.skip("a working GPU: nothing to fall back from")
    capfd.readouterr()
    embedder = OnnxEmbedder(
        models["onnx"], providers=["CUDAExecutionProvider", "CPUExecutionProvider"]
    )
    assert embedder.providers == CPU and embedder.device == "cpu"
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""


def test_threads(models, onnx_embedder):
    assert 1 <= physical_cores() <= (os.cpu_count() or 1)
    one_thread = OnnxEmbedder(models["onnx"], providers=CPU, threads=1)
    images = np.random.default_rng(4).random((2, 3, SIZE, SIZE), dtype=np.float32)
    np.testing.assert_allclose(one_thread.embed(images), onnx_embedder.embed(images), atol=1e-5)
    with pytest.raises(NearsightError, match="threads"):
        OnnxEmbedder(models["onnx"], threads=0)
