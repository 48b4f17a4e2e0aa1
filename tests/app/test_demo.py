"""`nearsight demo --no-launch` end to end at a tiny setting, and the reuse of finished steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest
from helpers import free_port, started, stop_process

from nearsight.app.cli import main
from nearsight.app.commands.demo import demo_config
from nearsight.training.config import DEMO_RECIPE, load_config

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
    out, err = capsys.readouterr()
    # measured in steps: exactly --steps updates, and the progress says so (plain lines here,
    # stderr is not a terminal)
    assert "training ResNet-50 with the ice loss for 3 steps at 32 px" in out
    records = (work / "run-ice" / "train.jsonl").read_text().splitlines()
    steps = [json.loads(record)["step"] for record in records]
    assert steps == [1, 2, 3]
    assert "train: 3 steps in " in err
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
    # the trained column is the trained gallery's own leave-one-out figure (eval agrees)
    assert main(["eval", "--gallery", str(work / "gallery-ice"), "--json"]) == 0
    assert trained == round(json.loads(capsys.readouterr().out)["recall@1"], 4)
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


def demo_args(*argv: str):
    """The demo's parsed options (nothing runs)."""
    import argparse

    from nearsight.app.commands import demo

    parser = argparse.ArgumentParser()
    demo.register(parser.add_subparsers())
    return parser.parse_args(["demo", *argv])


def test_the_demo_is_measured_in_steps_by_its_recipe_file(tmp_path):
    recipe = load_config(DEMO_RECIPE)  # nearsight/training/configs/demo.yaml
    assert recipe.steps and recipe.time_limit_s is None and recipe.expected_steps_per_s
    assert recipe.model.arch == "resnet50"
    config = demo_config(demo_args(), tmp_path)
    assert (config.steps, config.time_limit_s) == (recipe.steps, None)
    assert config.data.root == str(tmp_path) and config.loss.name == recipe.loss.name
    assert config.expected_steps_per_s == recipe.expected_steps_per_s
    assert demo_config(demo_args("--steps", "40"), tmp_path).steps == 40
    timed = demo_config(demo_args("--train-seconds", "90"), tmp_path)
    assert (timed.steps, timed.time_limit_s) == (None, 90.0)
    # another image size costs another time per step: no expected rate to judge it by
    assert demo_config(demo_args("--image-size", "64"), tmp_path).expected_steps_per_s is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "0"], "nearsight: error: --steps must be a positive number of steps, got 0"),
        (["--train-seconds", "-5"], "nearsight: error: --train-seconds must be positive, got -5"),
    ],
)
def test_a_bad_length_is_one_line(tmp_path, capsys, argv, message):
    work = tmp_path / "demo"
    assert main(["demo", "--workdir", str(work), "--no-launch", *argv]) == 2
    assert capsys.readouterr().err.strip() == message
    assert not work.exists()  # nothing is written before the options are checked


def test_steps_and_train_seconds_exclude_each_other(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--workdir", str(tmp_path), "--steps", "5", "--train-seconds", "5"])
    assert exit_.value.code == 2
    assert "argument --train-seconds: not allowed with argument --steps" in capsys.readouterr().err
