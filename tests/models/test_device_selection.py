"""Device selection on a machine without CUDA (simulated, so these run anywhere): ``auto``
trains on the CPU with a one-line note, ``--device cuda`` is a one-line error, and a GPU
provider that onnxruntime cannot start falls back to the CPU with a one-line note."""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from nearsight.app.cli import main
from nearsight.core.errors import NearsightError
from nearsight.data.datasets.synthetic import write_synthetic
from nearsight.models import onnx_session
from nearsight.models.checkpoint import save_checkpoint
from nearsight.models.embedder import OnnxEmbedder
from nearsight.models.embedding import EmbeddingConfig, EmbeddingNet
from nearsight.models.export import export_onnx
from nearsight.training.distributed import cuda_available, resolve_device

GPU_FIRST = ["CUDAExecutionProvider", "CPUExecutionProvider"]


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_auto_without_cuda_is_the_cpu_with_a_one_line_note(no_cuda, capsys):
    assert resolve_device("auto") == torch.device("cpu")
    err = capsys.readouterr().err
    assert err == "nearsight: note: no CUDA device, training on the CPU\n"


def test_auto_note_comes_from_the_first_local_process_only(no_cuda, capsys):
    assert resolve_device("auto", local_rank=1) == torch.device("cpu")
    assert capsys.readouterr().err == ""


def test_cpu_asked_for_is_silent(capsys):
    assert resolve_device("cpu") == torch.device("cpu")
    assert capsys.readouterr().err == ""


def test_cuda_without_a_device_is_an_error(no_cuda):
    with pytest.raises(NearsightError, match="--device cuda was asked for, but no CUDA device"):
        resolve_device("cuda")


def test_a_broken_driver_warning_does_not_reach_the_user(monkeypatch):
    def warns() -> bool:
        warnings.warn(
            "CUDA initialization: the driver is too old\n(long explanation)", stacklevel=1
        )
        return False

    monkeypatch.setattr(torch.cuda, "is_available", warns)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cuda_available() is False
    assert caught == []


def test_train_device_cuda_without_cuda_is_one_line_exit_2(no_cuda, tmp_path, capsys):
    root = tmp_path / "synth"
    write_synthetic(root, classes=4, per_class=2, size=32, seed=0)
    out = tmp_path / "run"
    code = main(
        [
            "train", "--dataset", "folder", "--root", str(root), "--loss", "ice",
            "--out", str(out), "--device", "cuda", "--steps", "1", "--image-size", "32",
        ]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("nearsight: error:")]
    assert len(errors) == 1 and "no CUDA device" in errors[0], err
    assert not out.exists()


@pytest.fixture(scope="module")
def onnx_model(tmp_path_factory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("device")
    torch.manual_seed(0)
    net = EmbeddingNet(EmbeddingConfig(dim=8, image_size=32, arch="resnet18")).eval()
    path = root / "model.onnx"
    export_onnx(save_checkpoint(root / "best.pt", net), path)
    yield path
    shutil.rmtree(root, ignore_errors=True)


def test_onnxruntime_gpu_fallback_is_one_note_line(onnx_model, monkeypatch, capfd):
    if OnnxEmbedder(onnx_model, providers=GPU_FIRST).device == "cuda":
        pytest.skip("onnxruntime's CUDA provider works here: nothing to fall back from")
    capfd.readouterr()
    # a GPU is there (the driver says so) but onnxruntime cannot start its CUDA provider
    monkeypatch.setattr(onnx_session, "_cuda_works", lambda: True)
    embedder = OnnxEmbedder(onnx_model, providers=GPU_FIRST)
    assert embedder.device == "cpu"
    captured = capfd.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("nearsight: note: onnxruntime could not start CUDAExecutionProvider")
    assert lines[0].endswith("running on the CPU")
