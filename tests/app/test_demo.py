"""`nearsight demo --no-launch` end to end at a tiny setting, and the reuse of finished steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
from helpers import free_port, started, stop_process

from nearsight.app.cli import main

TINY = [
    "--no-launch",
    "--classes",
    "6",
    "--per-class",
    "4",
    "--synth-size",
    "32",
    "--image-size",
    "32",
    "--steps",
    "3",
    "--workers",
    "0",
]


def test_demo_runs_the_pipeline_then_reuses_it(tmp_path, capsys):
    work = tmp_path / "demo"
    assert main(["demo", "--workdir", str(work), *TINY]) == 0
    out = capsys.readouterr().out
    for step in (
        "[1/5] generating",
        "[2/5] training",
        "[3/5] exporting",
        "[4/5] indexing",
        "[5/5] evaluating",
    ):
        assert step in out, step
    assert "done in" in out
    # the comparison table: the untrained gallery (the network of step 0) beside the trained one
    row = next(line for line in out.splitlines() if line.startswith("recall@1 "))
    untrained, trained = (float(x) for x in row.split()[1:])
    first = json.loads((work / "run-ice" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] == 0 and untrained == round(first["recall@1"], 4)
    assert 0.0 <= trained <= 1.0
    for artifact in (
        "data/synthetic.json",
        "run-ice/last.pt",
        "model-ice.onnx",
        "model-untrained.onnx",
        "gallery-ice/catalog.db",
        "gallery-untrained/catalog.db",
    ):
        assert (work / artifact).exists(), artifact

    # second run: every step is reused
    assert main(["demo", "--workdir", str(work), *TINY]) == 0
    out = capsys.readouterr().out
    assert out.count("reusing") == 5  # data, run, models, two galleries
    assert "generating" not in out and "training ResNet-50" not in out

    # third run, launching: the page serves both galleries until stopped (SIGTERM, which a
    # job started with `&` can still receive: it ignores SIGINT)
    port = free_port()
    launch = [a for a in TINY if a != "--no-launch"]
    with started(
        [sys.executable, "-m", "nearsight.app.cli", "demo", "--workdir", work, *launch,
         "--port", port],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    ) as process:  # fmt: skip
        lines = []
        while not any("serving 2 gallery(ies)" in line for line in lines):
            line = process.stdout.readline()
            assert line, "".join(lines) + process.stderr.read()
            lines.append(line)
        assert f"http://127.0.0.1:{port}/" in lines[-1]
        health = httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=30).json()
        assert [g["name"] for g in health["galleries"]] == ["gallery-ice", "gallery-untrained"]
        code = stop_process(process, timeout=60)
        err = process.stderr.read()
    assert code == 0 and "nearsight: stopped" in err, err  # closed, not killed
