"""Faults: a training run and a gallery writer killed with SIGKILL part-way, and a disk that
fills up mid-write. Real processes (`python -m app.cli ...`) where the fault is a kill.

Already covered elsewhere (not repeated here):
- tests/app/test_index_cli.py::test_killing_a_build_part_way_leaves_the_previous_gallery (SIGKILL
  during `index build`) and ::test_two_concurrent_adds_both_land (two `index add` processes on
  one gallery: both land, ids 0..16, catalog and index agree, serialised by the gallery lock);
- tests/index/test_gallery.py::test_sigkill_mid_write_leaves_the_previous_gallery (a writer killed
  between writing the new folder and renaming it) and ::test_concurrent_writers_lose_nothing
  (3 threads x 3 adds);
- tests/training/test_trainer.py::test_interrupt_and_resume_reproduces_the_uninterrupted_run (an
  in-process interruption; here the process is SIGKILLed).
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import FAST, cli_argv, read_jsonl, started

from nearsight.app.cli import main
from nearsight.data.datasets import load_dataset
from nearsight.data.datasets.synthetic import write_synthetic
from nearsight.index.gallery.core import Gallery
from nearsight.models.checkpoint import load_checkpoint, save_checkpoint
from nearsight.models.embedding import EmbeddingConfig, build_embedding_net

# one thread per process: the two concurrent training processes share 2 cores, and a CPU
# run is bit-for-bit repeatable only with the same thread count
CHILD_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
             "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}  # fmt: skip
TRAIN_STEPS = 4


def wait_for(
    condition, timeout: float, process: subprocess.Popen | None = None, every: float = 0.02
) -> bool:
    """Poll ``condition`` until it holds, ``timeout`` passes or ``process`` ends."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        if process is not None and process.poll() is not None:
            return condition()
        time.sleep(every)
    return False


def temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("faults") / "data"
    write_synthetic(root, classes=6, per_class=4, size=32)
    return root


@pytest.fixture(scope="module")
def gallery(data, tmp_path_factory) -> Iterator[dict]:
    root = tmp_path_factory.mktemp("faults-gallery")
    torch.manual_seed(0)
    model = save_checkpoint(
        root / "model.pt",
        build_embedding_net(EmbeddingConfig(dim=16, image_size=32, arch="resnet18")),
    )
    out = root / "gallery"
    argv = ["index", "build", "--model", str(model), "--dataset", "folder", "--root", str(data)]
    assert main([*argv, "--out", str(out), *FAST]) == 0
    yield {"model": model, "gallery": out}
    shutil.rmtree(root, ignore_errors=True)


def gallery_state(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def assert_whole(folder: Path) -> tuple[int, list[str]]:
    """Opens (catalog, index and embeddings agree: Gallery.open checks) and every stored
    embedding finds itself in the index at distance 0 (the added images repeat, so the id found
    may be a twin's); returns (count, paths)."""
    with Gallery.open(folder) as opened:
        distances, ids = opened.search(np.asarray(opened.embeddings), 1)
        assert distances.max() < 1e-3 and set(ids[:, 0].tolist()) <= set(opened.ids.tolist())
        return len(opened), [row["path"] for row in opened.all_items()]


# -- SIGKILL during training, then --resume -----------------------------------------------------


@pytest.mark.slow  # three training processes (two at once): ~30 s on 2 cores
def test_sigkill_during_train_then_resume_matches_an_uninterrupted_run(data, tmp_path):
    common = ["train", "--dataset", "folder", "--root", data, "--loss", "ice",
              "--image-size", "32", "--dim", "16", "--classes-per-batch", "3", "--per-class", "2",
              "--steps", TRAIN_STEPS, "--eval-every", "3", "--device", "cpu", *FAST,
              "--set", "save_every=1", "--set", "log_every=1",
              "--set", "data.eval_batch_size=16"]  # fmt: skip
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "env": CHILD_ENV}
    with started(cli_argv(*common, "--out", straight), **quiet) as reference:
        with started(cli_argv(*common, "--out", killed), **quiet) as victim:
            # step 3 trained: last.pt holds step 2 (save_every=1). Then kill the moment a
            # checkpoint write begins (step 3's evaluation writes best.pt and last.pt): the
            # hardest point, a half-written checkpoint beside a whole one, and an evaluation
            # line already logged
            def writing_a_checkpoint_after_step_3() -> bool:
                log = killed / "train.jsonl"
                return (
                    log.exists()
                    and len(read_jsonl(log)) >= 3
                    and any(name.endswith(".tmp") for name in temporaries(killed))
                )

            hit = wait_for(writing_a_checkpoint_after_step_3, 240, victim)
            assert hit, victim.stderr.read().decode()[-2000:]
            victim.send_signal(signal.SIGKILL)
            assert victim.wait(timeout=30) == -signal.SIGKILL
        saved_step = load_checkpoint(killed / "last.pt")["state"]["step"]
        assert 2 <= saved_step < TRAIN_STEPS
        left = temporaries(killed)
        assert left  # the half-written checkpoint
        print(f"\nkilled after step {len(read_jsonl(killed / 'train.jsonl'))} was logged, writing "
              f"{left}; last.pt at step {saved_step}")  # fmt: skip

        resumed = subprocess.run(cli_argv("train", "--out", killed, "--resume"),
                                 capture_output=True, env=CHILD_ENV, timeout=300)  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr.decode()[-3000:]
        assert f"resumed from {killed / 'last.pt'} at step {saved_step}" in resumed.stderr.decode()
        _, err = reference.communicate(timeout=300)
        assert reference.returncode == 0, err.decode()[-3000:]

    # the loss curve: every step once, the same losses and learning rates
    expected, got = read_jsonl(straight / "train.jsonl"), read_jsonl(killed / "train.jsonl")
    assert [r["step"] for r in got] == list(range(1, TRAIN_STEPS + 1))
    worst = max(abs(h["loss"] - w["loss"]) for w, h in zip(expected, got, strict=True))
    print(f"resumed from step {saved_step}: max |loss - uninterrupted loss| = {worst:.1e}")
    for want, have in zip(expected, got, strict=True):
        assert have["loss"] == pytest.approx(want["loss"], rel=1e-6, abs=1e-6), have["step"]
        lrs = {k: v for k, v in want.items() if k.startswith("lr_")}
        assert {k: have[k] for k in lrs} == pytest.approx(lrs, rel=1e-9)
    # the evaluations (steps 3 and 4): the same numbers
    expected, got = read_jsonl(straight / "metrics.jsonl"), read_jsonl(killed / "metrics.jsonl")
    assert [r["step"] for r in got] == [3, TRAIN_STEPS]
    for want, have in zip(expected, got, strict=True):
        assert have == pytest.approx(want, rel=1e-6, abs=1e-6)
    assert (
        load_checkpoint(killed / "best.pt")["training"]["step"]
        == (load_checkpoint(straight / "best.pt")["training"]["step"])
    )
    assert temporaries(killed) == []  # the resumed run swept the half-written file


# -- SIGKILL while `index add` writes -----------------------------------------------------------

BIG = 100_000  # items: the writer's temporary folder then lives ~0.4 s here, long enough to aim


@pytest.fixture(scope="module")
def big_gallery(gallery, tmp_path_factory) -> Path:
    """A gallery of BIG random unit vectors under the tiny model (items are never read back
    from their files by `index add`, so their paths need not exist)."""
    from nearsight.index.gallery.write import write_gallery
    from nearsight.models.loading import load_embedder

    embedder = load_embedder(gallery["model"], device="cpu")
    vectors = np.random.default_rng(0).standard_normal((BIG, embedder.dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    items = [{"path": f"/nowhere/{i}.png", "label": i % 100} for i in range(BIG)]
    out = tmp_path_factory.mktemp("big") / "gallery"
    meta = {"model": str(gallery["model"]), "image_size": embedder.image_size}
    write_gallery(out, vectors, items, model_sha256=embedder.model_sha256, meta=meta)
    return out


def assert_big_whole(folder: Path) -> int:
    """Opens (Gallery.open checks that catalog, index and embeddings agree) and a sample of
    the stored embeddings find themselves in the index."""
    with Gallery.open(folder) as opened:
        sample = np.linspace(0, len(opened) - 1, 50).astype(int)
        distances, ids = opened.search(np.asarray(opened.embeddings)[sample], 1)
        assert distances.max() < 1e-3
        np.testing.assert_array_equal(ids[:, 0], opened.ids[sample])
        return len(opened)


def writing_traces(folder: Path, before: dict[str, bytes]) -> list[str]:
    """What an `index add` in progress shows in the gallery: its segment (temporary or
    renamed, not yet listed) and SQLite's rollback journal while the catalog commits."""
    return sorted(
        p.name
        for p in folder.iterdir()
        if p.name not in before and (p.name.startswith(("segment-", ".segment-")) or
                                     p.name.endswith("-journal"))
    )  # fmt: skip


@pytest.mark.slow  # a CLI process (imports torch)
def test_sigkill_while_index_add_writes_leaves_a_whole_gallery(data, big_gallery, tmp_path):
    """Kill `index add` the moment it starts writing (its segment file appears in the gallery;
    it then fsyncs and renames it and commits one catalog transaction that lists it). The
    gallery must open whole: the old one, or the new one if the commit won the race, never a
    mix; the next writer deletes the unlisted segment."""
    extra = [str(p) for p in load_dataset("folder", data, "train").paths]  # 12 images
    target = tmp_path / "gallery"
    for attempt in range(1, 7):
        print(f"\nattempt {attempt}: ", end="")
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(big_gallery, target)
        before = gallery_state(target)
        with started(
            cli_argv("index", "add", "--gallery", target, *extra, *FAST),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=CHILD_ENV,
        ) as process:  # fmt: skip
            seen = wait_for(
                lambda seen=before: bool(writing_traces(target, seen)), 120, process, every=0.001
            )
            if seen:
                process.send_signal(signal.SIGKILL)
            code = process.wait(timeout=60)
        left = writing_traces(target, before)
        count = assert_big_whole(target)
        if code == -signal.SIGKILL:
            break
        assert code == 0, process.stderr.read().decode()[-2000:]  # finished before the kill
        assert count == BIG + len(extra)
    else:
        pytest.fail("the writer finished six times before it could be killed mid-write")
    assert count in (BIG, BIG + len(extra))
    if count == BIG:  # byte for byte, but for the unlisted segment the killed writer left and
        # SQLite's journal when the kill came as the commit began (not hot: nothing to undo)
        state = gallery_state(target)
        assert {name: state[name] for name in before} == before
        new_files = set(state) - set(before)
        assert all(name in writing_traces(target, before) for name in new_files), new_files
    # the next writer sweeps what the killed one left
    assert main(["index", "add", "--gallery", str(target), extra[0], *FAST]) == 0
    assert temporaries(tmp_path) == []
    assert not [name for name in os.listdir(target) if name.startswith(".segment-")]
    assert not [name for name in os.listdir(target) if name.endswith("-journal")]
    with Gallery.open(target) as opened:
        listed = set(opened.meta["segments"])
    assert {name for name in os.listdir(target) if name.startswith("segment-")} == listed
    assert assert_big_whole(target) == count + 1
    print(f"killed while writing ({left}); whole with {count} items")


# -- a full disk ------------------------------------------------------------------------------


@contextlib.contextmanager
def file_size_limit(limit_bytes: int) -> Iterator[None]:
    """Writes past ``limit_bytes`` fail with EFBIG, as on a full disk (RLIMIT_FSIZE, soft limit
    only, restored after; SIGXFSZ ignored so that the write fails instead of killing us)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    previous_bytecode = sys.dont_write_bytecode
    sys.dont_write_bytecode = True  # an import meanwhile must not write a truncated .pyc
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        sys.dont_write_bytecode = previous_bytecode
        signal.signal(signal.SIGXFSZ, previous_handler)


def one_error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("nearsight: error:")]
    assert len(lines) == 1, err
    return lines[0]


def test_a_full_disk_while_writing_a_gallery_keeps_the_previous_one(
    data, gallery, tmp_path, capsys
):
    target = tmp_path / "gallery"
    shutil.copytree(gallery["gallery"], target)
    before = gallery_state(target)
    extra = [str(p) for p in load_dataset("folder", data, "train").paths]
    rebuild = ["index", "build", "--model", str(gallery["model"]), "--dataset", "folder",
               "--root", str(data), "--split", "all", "--out", str(target), *FAST]  # fmt: skip
    add = ["index", "add", "--gallery", str(target), *extra, *FAST]
    for argv in (rebuild, add):
        with file_size_limit(4096):  # the catalog alone is larger
            code = main(argv)
        err = capsys.readouterr().err
        assert code == 2
        line = one_error_line(err)  # build: writing the new folder; add: the catalog commit
        assert str(target) in line and ("cannot write" in line or "cannot be written" in line)
        assert gallery_state(target) == before
        # nothing left beside the gallery but its lock file (a build refused before locking
        # has none yet): no temporary folder, no chunks
        assert sorted(p.name for p in tmp_path.iterdir() if p.name != ".gallery.lock") == [
            "gallery"
        ]
    assert main(add) == 0  # space again: the same command works
    assert assert_whole(target)[0] == 24


def test_a_full_disk_while_saving_a_checkpoint_is_one_line(data, tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", "--dataset", "folder", "--root", str(data), "--loss", "ice",
            "--image-size", "32", "--dim", "16", "--classes-per-batch", "3", "--per-class", "2",
            "--steps", "2", "--device", "cpu", *FAST, "--set", "save_every=1"]  # fmt: skip
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with file_size_limit(1_000_000):  # a ResNet-50 checkpoint is ~100 MB
            code = main([*argv, "--out", str(run)])
    finally:
        torch.set_num_threads(threads)
    err = capsys.readouterr().err
    assert code == 2
    assert f"cannot write checkpoint {run / 'last.pt'}" in one_error_line(err)
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "train.jsonl"]  # no .tmp
