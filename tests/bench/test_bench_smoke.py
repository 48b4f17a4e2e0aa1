"""Every script in bench/ runs at its smallest size and prints its figures (smoke tests: a bench
that no test runs rots unseen, as bench/app_latency.py did when the search split renamed what
it called). The numbers are not judged here: at these sizes they mean nothing; bench/ at its
real sizes measures them. Each bench whose ``--workdir`` is given a folder that does not exist
yet makes it.

The scripts run side by side, :data:`SMOKE_AT_ONCE` at a time, started together by the first
test that asks for one (most of each run is its interpreter importing torch or gradio and
waiting on a server or a subprocess); each test then waits for its own script's run."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import ROOT, stop_process

BENCH = ROOT / "bench"
SMOKE_TIMEOUT_S = 600
# runs at once: one more than the cores, as the runs wait on their subprocesses and servers
SMOKE_AT_ONCE = (os.cpu_count() or 1) + 1
# script -> (its smallest run's arguments, {workdir} a folder that does not exist yet, {data} a
# synthetic image folder of 16 classes x 4 made by the test; what its output must hold: one
# regular expression per figure)
SMOKE: dict[str, tuple[list[str], list[str]]] = {
    "app_latency.py": (
        ["--smoke", "--workdir", "{workdir}"],
        [r"direct embed : p50 +[\d.]+ ms", r"REST POST /api/search, 4 client\(s\) x 4: p50",
         r"gradio_client /search, 1 client\(s\)", r"rest_p50_1_client_over_direct: [\d.]+",
         r"rest_qps_4_clients_over_direct_rate: [\d.]+"],
    ),
    "app_latency_paired.py": (
        ["--smoke", "--query-format", "jpeg", "--workdir", "{workdir}"],
        [r"rest +: p50 +[\d.]+ ms", r"decode\+embed\+search +: p50 +[\d.]+ ms",
         r"rest_over_embed\+search_p50: [\d.]+", r"rest_over_embed\+search_round_median: [\d.]+"],
    ),
    "append_bytes.py": (
        ["--items", "1000", "--dim", "16", "--workdir", "{workdir}"],
        [r"add of 1 item to a 1000-item, 16-d gallery \(\d+ bytes on disk\): wchar \d+ bytes, "
         r"write_bytes \d+ bytes"],
    ),
    "catalog_columns.py": (
        ["--items", "3000", "--repeats", "2", "--workdir", "{workdir}"],
        [r"category>=100 category<130: \d+ ids, SQL [\d.]+ ms, column read [\d.]+ s, "
         r"arrays p50 [\d.]+ ms", r"arrays \d+ MB, peak RSS \d+ MB"],
    ),
    "cli_search.py": (
        ["--items", "50", "--image-size", "32", "--repeats", "1", "--workdir", "{workdir}"],
        [r"before: [\d.]+ s wall", r"after: [\d.]+ s wall, [\d.]+ s CPU, \d+ MB peak RSS",
         r"after/before: wall [\d.]+, peak [\d.]+"],
    ),
    "decode.py": (
        ["--images", "2"],
        [r"cub 640x427 at 224 px, img/s on one core: test_full \d+", r"sop 1536x1024"],
    ),
    "defaults_labelled.py": (
        ["--smoke"],
        [r"raw pixels: Recall@1 [\d.]+", r"defaults +0 +2 +[\d.]+ +[\d.]+  lr ",
         r"defaults +mean trained Recall@1 over 1 seeds"],
    ),
    "demo_recipe.py": (
        ["--steps", "2", "--variants", "demo", "--workers", "0", "--data", "{data}"],
        [r"demo +0 +2 +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+", r"demo: mean R@1 after [\d.]+"],
    ),
    "embed.py": (
        ["--image-size", "32", "--arch", "resnet18", "--batch", "2", "--rounds", "1",
         "--warmup", "0", "--classes", "4", "--per-class", "2", "--calibration-images", "2"],
        [r"onnxruntime CPU: [\d.]+ images/s; ratio [\d.]+x", r"int8 .*: [\d.]+ images/s",
         r"Recall@1 on the synthetic test split"],
    ),
    "facets.py": (["--items", "2000", "--repeats", "1"], [r'"p50_ms": [\d.]+']),
    "fair_shares.py": (
        ["--smoke"],
        [r'rest \{"alone_p50_s": [\d.]+, "victim_p50_s": [\d.]+',
         r'page \{"alone_p50_s": [\d.]+, "victim_p50_s": [\d.]+'],
    ),
    "floods.py": (
        ["--smoke"],
        [r'idle p50 s \{"plain": [\d.]+, "filtered": [\d.]+, "reranked": [\d.]+, "upload": [\d.]+',
         r"networks: p50 s .*; ratio to 3 x idle \+ 100 ms \{\"plain\": [\d.]+",
         r"connections: p50 s .*; ratio to 3 x idle \+ 100 ms \{\"plain\": [\d.]+",
         r'bodies: longest wait s \{"health": [\d.]+, "plain": [\d.]+\}',
         r'pipelining: \{"connections": \d+, "closed": \d+'],
    ),
    "filtered_catalog.py": (
        ["--items", "3000", "--categories", "30", "--queries", "5", "--workdir", "{workdir}"],
        [r'"group": \{\s*"route": \{\s*"recall": [\d.]+'],
    ),
    "filtered_search.py": (
        ["--items", "2000", "--types", "flat", "--shares", "0.1", "--queries", "10",
         "--workdir", "{workdir}"],
        [r'"recall_min": [\d.]+', r'"p50_ms_max": [\d.]+', r'"first_ms_max": [\d.]+'],
    ),
    # its --cpu-smoke run, every part, is tests/test_gpu_check.py::test_cpu_smoke_runs_every_part
    "gpu_check.py": ([], []),
    "gpu_profile.py": (
        ["{workdir}", "--smoke", "--losses", "ice"],
        [r"ice 4x2 [\d.]+ [\d.]+ \S+ [\d.]+ [\d.]+ [\d.]+ [\d.]+"],
    ),
    "inspect_labels.py": (
        ["--seeds", "0"],
        [r'"confident learning": [\d.]+, "vote k=10": [\d.]+'],
    ),
    "index_scale.py": (
        ["--items", "2000", "--types", "flat", "--queries", "10", "--single", "5",
         "--batches", "2", "--clusters", "10", "--workdir", "{workdir}"],
        [r"flat +2000: build \d+s, \d+ MB, open [\d.]+s, p50 [\d.]+ ms, p95 [\d.]+ ms, "
         r"recall@10 [\d.]+"],
    ),
    "losses.py": (
        ["--smoke", "--device", "cpu"],
        [r"PML RankedListLoss +[\d.]+", r"ratio ours-RLL / PML-RLL at N=30, D=16 on cpu .*: "
         r"[\d.]+"],
    ),
    # (its quality part tunes a grid for minutes; its latency part is the other helper's)
    "rerank.py": (
        ["rest", "--items", "200", "--queries", "2"],
        [r"none +[\d.]+ ms +1\.00x plain", r"kreciprocal +[\d.]+ ms +[\d.]+x plain"],
    ),
    "search.py": (
        ["--sizes", "1000", "--queries", "5", "--batches", "2", "--eval-items", "500",
         "--eval-classes", "10", "--workdir", "{workdir}"],
        [r"flat +1,000 items: batch 1 p50 [\d.]+ ms", r"PML / ours = [\d.]+"],
    ),
    "search_oracle.py": (["--examples", "1"], [r"1 passed"]),
    "seed_losses_synth.py": (
        ["--smoke"], [r"ice +2 +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+"],
    ),
    "sharded_build.py": (
        ["--images", "128", "--size", "32", "--arch", "resnet18"],
        [r"1 process : wall +[\d.]+ s  CPU +[\d.]+ s",
         r"CPU ratio 2 / 1: [\d.]+ \(goal < 1.3\); same ids True"],
    ),
    "timm_backbones.py": (
        ["--smoke"],
        [r"family +export s", r"cnn +[\d.]+ +[\d.e+-]+ +[\d.]+", r"vit +[\d.]+ +[\d.e+-]+ +[\d.]+"],
    ),
    "train_step.py": (
        ["--image-size", "32", "--batch", "8", "--steps", "1", "--warmup", "0", "--workers", "0"],
        [r"bare forward\+backward +[\d.]+ images/s", r"full training step +[\d.]+ images/s",
         r"ratio full / bare +[\d.]+"],
    ),
}  # fmt: skip


def bench_scripts() -> list[str]:
    """The scripts of bench/: the files that run as a program (an ``if __name__ ==
    "__main__"`` block); the others are the scripts' shared parts."""
    scripts = []
    for path in sorted(BENCH.glob("*.py")):
        tree = ast.parse(path.read_text())
        if any(
            isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body
        ):
            scripts.append(path.name)
    return scripts


def test_every_bench_script_has_a_smoke_run():
    assert sorted(SMOKE) == bench_scripts()


SMOKE_SCRIPTS = [s for s in sorted(SMOKE) if SMOKE[s][1]]


def run_smoke(script: str, tmp_path: Path, stop: threading.Event | None = None):
    """``bench/SCRIPT`` at its smallest size in ``tmp_path``: (the finished process, its
    stdout + stderr). A set ``stop`` ends the run (the module's tests are over)."""
    arguments = SMOKE[script][0]
    workdir = tmp_path / "not-yet" / "work"  # --workdir: made by the bench
    data = tmp_path / "data"
    if "{data}" in arguments:
        from nearsight.data.datasets.synthetic import write_synthetic

        write_synthetic(data, classes=16, per_class=4, size=48, seed=0)
    argv = [argument.format(workdir=workdir, data=data) for argument in arguments]
    # one OpenMP thread each: the suite shares the machine; the figures are not judged here
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "GRADIO_ANALYTICS_ENABLED": "False", "OMP_NUM_THREADS": "1"}  # fmt: skip
    process = subprocess.Popen(
        [sys.executable, str(BENCH / script), *argv],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    watchdog = threading.Timer(SMOKE_TIMEOUT_S, stop_process, [process])
    stopper = threading.Thread(target=lambda: stop.wait() and stop_process(process), daemon=True)
    watchdog.start()
    if stop is not None:
        stopper.start()
    try:
        output, _ = process.communicate()
    finally:
        watchdog.cancel()
        stop_process(process)
    return process, output


def check_smoke(script: str, tmp_path: Path, process: subprocess.Popen, output: str) -> None:
    arguments, figures = SMOKE[script]
    assert process.returncode == 0, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    for figure in figures:
        assert re.search(figure, output), (figure, output[-4000:])
    if "{workdir}" in arguments:
        assert (tmp_path / "not-yet" / "work").is_dir()


@pytest.fixture(scope="module")
def smoke_runs(request, tmp_path_factory) -> Iterator[dict[str, tuple[Path, Future]]]:
    """{script: (its folder, its run)} for every smoke run this session selected, all started
    at once."""
    selected = {item.callspec.params["script"] for item in request.session.items
                if getattr(item, "originalname", None) == SMOKE_TEST}  # fmt: skip
    root = tmp_path_factory.mktemp("smoke")
    stop = threading.Event()
    runs = {}
    with ThreadPoolExecutor(SMOKE_AT_ONCE, thread_name_prefix="smoke") as pool:
        for script in sorted(selected, key=started_order):
            folder = root / script.removesuffix(".py")
            folder.mkdir()
            runs[script] = (folder, pool.submit(run_smoke, script, folder, stop))
        try:
            yield runs
        finally:
            stop.set()  # the runs not waited for (a test failed, or was deselected) end now
    shutil.rmtree(root, ignore_errors=True)


# started first, in this order: the longest runs (CPU seconds, measured), so that the last to
# finish is a short one
SLOWEST_FIRST = ("app_latency.py", "cli_search.py", "search_oracle.py", "rerank.py", "embed.py")
SMOKE_TEST = "test_the_bench_runs_at_its_smallest_size_and_prints_its_figures"


def started_order(script: str) -> tuple[int, str]:
    rank = SLOWEST_FIRST.index(script) if script in SLOWEST_FIRST else len(SLOWEST_FIRST)
    return rank, script


@pytest.mark.slow
@pytest.mark.parametrize("script", SMOKE_SCRIPTS)
def test_the_bench_runs_at_its_smallest_size_and_prints_its_figures(script, smoke_runs):
    folder, run = smoke_runs[script]
    check_smoke(script, folder, *run.result())


def test_a_smoke_run_fails_when_the_bench_fails(tmp_path, monkeypatch):
    """The check itself: a bench that raises, or that prints no figure, fails its test."""
    broken = tmp_path / "bench"
    broken.mkdir()
    (broken / "broken.py").write_text("raise SystemExit('no figures')\n")
    monkeypatch.setattr(sys.modules[__name__], "BENCH", broken)
    monkeypatch.setitem(SMOKE, "broken.py", ([], [r"figure \d+"]))
    with pytest.raises(AssertionError, match="no figures"):
        check_smoke("broken.py", tmp_path, *run_smoke("broken.py", tmp_path))
