"""The precision and thread choices that follow the hardware (issue 27): bf16 autocast and
channels_last on CUDA and on CPUs with native bf16, off elsewhere; each process's share of the
cores. The CPU flags are handed in, so every branch runs on any CPU."""

from __future__ import annotations

import pytest

from nearsight.core import threads
from nearsight.models.hardware import cpu_has_native_bf16, resolve_fast_math

EPYC_GENOA = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
SKYLAKE = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16\n"


def test_native_bf16_is_read_from_the_cpu_flags():
    assert cpu_has_native_bf16(EPYC_GENOA)
    assert not cpu_has_native_bf16(SKYLAKE)
    assert not cpu_has_native_bf16(GRAVITON3)  # no x86 bf16 units: torch emulates
    assert not cpu_has_native_bf16("")


@pytest.mark.parametrize(
    ("cuda", "cpuinfo", "expected"),
    [(True, SKYLAKE, (True, True)), (False, EPYC_GENOA, (True, True)),
     (False, SKYLAKE, (False, False))],
)  # fmt: skip
def test_auto_turns_bf16_and_channels_last_on_where_they_are_native(cuda, cpuinfo, expected):
    amp, channels_last, line = resolve_fast_math("auto", "auto", cuda=cuda, cpuinfo=cpuinfo)
    assert (amp, channels_last) == expected
    assert "(auto)" in line and ("on" if expected[0] else "off") in line


def test_explicit_settings_win_over_auto():
    assert resolve_fast_math(False, True, cuda=False, cpuinfo=EPYC_GENOA)[:2] == (False, True)
    assert resolve_fast_math(True, "auto", cuda=False, cpuinfo=SKYLAKE)[:2] == (True, False)


def test_a_training_step_under_cpu_bf16_keeps_the_loss_in_float32(tmp_path, monkeypatch, capsys):
    """With native bf16 (mocked where the CPU lacks it) the trainer says so in one line, runs
    its steps under CPU autocast, and the loss it logs is a finite float32 value."""
    import json

    from nearsight.data.datasets.synthetic import write_synthetic
    from nearsight.models import hardware
    from nearsight.training.config import load_config
    from nearsight.training.run import train

    monkeypatch.setattr(hardware, "cpu_flags", lambda cpuinfo=None: {"avx512_bf16"})
    root = tmp_path / "data"
    write_synthetic(root, classes=8, per_class=4, size=32, seed=0)
    config = load_config(None, {
        "data.dataset": "folder", "data.root": str(root), "data.image_size": 32,
        "data.workers": 0, "model.dim": 16,
        "model.pretrained": "none", "sampler.classes_per_batch": 4, "sampler.per_class": 2,
        "steps": 2, "eval_every": 2, "log_every": 1, "save_every": 10,
    })  # fmt: skip
    train(config, tmp_path / "run")
    assert "precision: bf16 autocast on (auto), channels_last on (auto)" in capsys.readouterr().err
    losses = [json.loads(line)["loss"] for line in (tmp_path / "run" / "train.jsonl").open()]
    assert len(losses) == 2 and all(isinstance(v, float) and v == v for v in losses)


def test_each_process_takes_its_share_of_the_cores(monkeypatch):
    monkeypatch.setattr(threads, "physical_cores", lambda: 16)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert threads.worker_threads() == 16
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert threads.worker_threads() == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")
    assert threads.worker_threads() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # torchrun sets 1; a user may set more
    assert threads.worker_threads() == 3
    assert threads.worker_threads(2) == 2  # an explicit flag wins


def test_onnxruntime_sessions_take_the_share(monkeypatch, onnx_gallery):
    from nearsight.models.embedder import OnnxEmbedder

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    embedder = OnnxEmbedder(onnx_gallery.model, providers=["CPUExecutionProvider"])
    assert embedder.session.get_session_options().intra_op_num_threads == 1
