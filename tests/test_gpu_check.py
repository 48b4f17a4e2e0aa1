"""bench/gpu_check.py, the one-command GPU check: its --cpu-smoke mode runs every part at a
tiny size on the CPU (so the script itself is tested here, without a GPU), and on a machine
without CUDA the GPU-only parts skip with their reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu_check.py"
PARTS = ("train", "data", "export", "search", "eval", "resume", "timm")
SEED_LOSSES = ("ice", "rll", "nra", "rankmi", "bcontrastive")


def run_check(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def test_help_documents_every_part():
    result = run_check("--help")
    assert result.returncode == 0
    for part in PARTS:
        assert f"\n  {part} " in result.stdout, part
    for option in ("--parts", "--cpu-smoke", "--json"):
        assert option in result.stdout


def test_unknown_part_is_one_line_error():
    result = run_check("--parts", "train,warp")
    assert result.returncode == 2
    assert "unknown part(s) warp" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_cpu_smoke_runs_every_part(tmp_path):
    summary_path = tmp_path / "summary.json"
    result = run_check("--cpu-smoke", "--json", str(summary_path))
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(summary_path.read_text())
    assert summary["environment"]["cpu_smoke"] is True
    assert list(summary["parts"]) == list(PARTS)
    for name, part in summary["parts"].items():
        assert part["status"] == "ok", (name, part["reason"])
        measured = [row for row in part["rows"] if not row.get("skipped")]
        assert measured, name
        for row in part["rows"]:
            assert row.get("skipped") or row["value"] is not None, row
    # the smoke trains the script's own paths, ICE eager and RankMI compiled (its critic
    # batches); every other design and step has its row, skipped with the reason (each loss's
    # design: test_train_runs_use_each_papers_shipped_cub_design; the losses train, eager and
    # compiled, in tests/training)
    train_rows = summary["parts"]["train"]["rows"]
    trained = {(row["name"].split()[0], row["step"]) for row in train_rows if "skipped" not in row}
    assert trained == {("ice", "eager"), ("rankmi", "compiled")}
    skipped = {row["name"]: row["skipped"] for row in train_rows if "skipped" in row}
    for loss in (*SEED_LOSSES, "proxyanchor"):
        for step in ("eager", "compiled"):
            assert (loss, step) in trained or "--cpu-smoke" in skipped[f"{loss} step {step}"]
    for row in train_rows:
        if not row.get("skipped"):
            assert row["value"] > 0 and row["peer"] > 0 and row["ratio"] > 0
    resume = summary["parts"]["resume"]["rows"]
    assert all(row["exact"] for row in resume)
    export = {row["name"]: row for row in summary["parts"]["export"]["rows"]}
    parity = next(row for name, row in export.items() if name.startswith("parity"))
    assert parity["within_tolerance"]
    # every skipped row says why
    for part in summary["parts"].values():
        for row in part["rows"]:
            if "skipped" in row:
                assert len(row["skipped"]) > 10
    # the table names every part
    for part in PARTS:
        assert f"\n{part:<7} " in result.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: nothing skips")
def test_without_cuda_the_gpu_parts_skip_with_their_reason(tmp_path):
    summary_path = tmp_path / "summary.json"
    result = run_check("--parts", "train,export,resume", "--json", str(summary_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "nearsight: note: no CUDA device here" in result.stderr
    parts = json.loads(summary_path.read_text())["parts"]
    for name in ("train", "export", "resume"):
        assert parts[name]["status"] == "skipped"
        assert "needs a CUDA device" in parts[name]["reason"]
        assert f"{name:<7} SKIPPED: " in result.stdout


def test_train_runs_use_each_papers_shipped_cub_design(tmp_path, monkeypatch):
    """The train part measures each loss at its paper's batch design: a config folder that
    does not exist made every loss fall back to the default 16x4 design without a word."""
    from nearsight.training.config import load_config

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    from gpu_check_common import Context, Sizes
    from gpu_check_train import CONFIGS, SEED_LOSSES, loss_config

    ctx = Context.create(tmp_path, Sizes.full(), smoke=False, workers=0)
    for loss in SEED_LOSSES:
        shipped = CONFIGS / f"{loss}_cub.yaml"
        assert shipped.is_file(), shipped
        paper = load_config(shipped)
        config = loss_config(ctx, loss, tmp_path, out_steps=3)
        design = (config.sampler.classes_per_batch, config.sampler.per_class, config.model.dim)
        expected = (paper.sampler.classes_per_batch, paper.sampler.per_class, paper.model.dim)
        assert design == expected, loss
        assert config.data.image_size == 224 and config.steps == 3
