"""``nearsight reproduce`` on a tiny CUB-layout dataset: the paper's row, ours and the final
step's, both files, the config's differences from the paper, and a run killed during training
that resumes to the same table."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import assert_one_line_error, run, started, torchrun

from nearsight.app.reproduce.run import Reproduction
from nearsight.app.reproduce.table import render
from nearsight.core.errors import NearsightError
from nearsight.data.datasets.synthetic import write_synthetic

# a tiny size from the command line: 32 px, 16-d, 8 steps of 3 classes x 2 images, from scratch
# (--pretrained none: the config's ImageNet weights are not at hand)
TINY = {
    "data.image_size": 32, "data.resize": 32, "model.dim": 16,
    "steps": 8, "eval_every": 4, "save_every": 1, "log_every": 1,
    "sampler.classes_per_batch": 3, "sampler.per_class": 2, "data.workers": 0,
    "data.eval_batch_size": 16, "amp": "false", "channels_last": "false",
}  # fmt: skip
SETS = [arg for key, value in TINY.items() for arg in ("--set", f"{key}={value}")]
SETS += ["--pretrained", "none"]
TABLE_KEYS = ("columns", "paper", "ours", "difference", "ours_final_step", "citation",
              "selection", "queries")  # fmt: skip


def write_tiny_cub(root: Path) -> Path:
    """CUB_200_2011's layout over synthetic 32 px images: classes 1-4 train, 101-104 test."""
    synth = root / "synth"
    write_synthetic(synth, classes=8, per_class=4, size=32, seed=0)
    cub = root / "CUB_200_2011"
    images, labels, names = [], [], []
    folders = sorted({path.parent for path in synth.rglob("*.png")}, key=lambda p: p.name)
    for number, folder in enumerate(folders):
        class_id = number + 1 if number < 4 else 97 + number
        name = f"{class_id:03d}.{folder.name}"
        names.append(f"{class_id} {name}")
        for image in sorted(folder.glob("*.png")):
            (cub / "images" / name).mkdir(parents=True, exist_ok=True)
            shutil.copy(image, cub / "images" / name / image.name)
            images.append(f"{len(images) + 1} {name}/{image.name}")
            labels.append(f"{len(labels) + 1} {class_id}")
    for file_name, lines in (("images.txt", images), ("image_class_labels.txt", labels),
                             ("classes.txt", names)):  # fmt: skip
        (cub / file_name).write_text("\n".join(lines) + "\n")
    shutil.rmtree(synth)
    return root


@pytest.fixture(scope="module")
def cub(tmp_path_factory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("cub")
    yield write_tiny_cub(root)
    shutil.rmtree(root, ignore_errors=True)


def reproduce(cub: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "nearsight.app.cli", "reproduce", "rankmi_cub", "--root",
            str(cub), "--out", str(out), "--workers", "0", *SETS, *extra]  # fmt: skip


def table(out: Path) -> dict:
    report = json.loads((out / "reproduction.json").read_text())
    return {key: report[key] for key in TABLE_KEYS}


ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # both runs do the same arithmetic


def test_reproduce_writes_both_rows_and_a_killed_run_resumes_to_the_same_table(cub, tmp_path):
    straight = tmp_path / "straight"
    done = subprocess.run(reproduce(cub, straight), env=ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    markdown = (straight / "reproduction.md").read_text()
    assert markdown in done.stdout  # printed as well as written
    assert "| paper | 66.7 | 77.2 | 85.1 | 91.0 | 71.3 | - |" in markdown
    assert "| ours |" in markdown and "| ours - paper |" in markdown
    assert 'Table 1 (CUB-200-2011), row "RankMI (Ours) 128R"' in markdown
    assert "`--set steps=8` (the config: 3000)" in markdown
    assert "`--set model.pretrained=none` (the config: imagenet)" in markdown  # --pretrained
    # the network after the last step, from the training's final evaluation, beside best.pt
    final = json.loads((straight / "train" / "metrics.jsonl").read_text().splitlines()[-1])
    assert final["step"] == 8
    row = [100 * final[name] for name in ("recall@1", "recall@2", "recall@4", "recall@8", "nmi",
                                          "map@r")]  # fmt: skip
    assert "| ours, final step | " + " | ".join(f"{v:.1f}" for v in row) + " |" in markdown
    assert "step 8), from the training's final evaluation" in markdown
    # RankMI does not say which network it reports: the final one is compared as well
    assert "| ours, final step - paper | " in markdown
    # RankMI says nothing of which network its tables report
    assert "Which network the paper reports is not known: sec. 4.1" in markdown
    assert "as the paper" not in markdown.split("Model selection")[1]
    # the config's differences from the paper, each in the table
    for difference in ("beta0 until the critic has a root", "frozen BatchNorm statistics",
                       "our sampler draws exactly m"):  # fmt: skip
        assert difference in markdown, difference
    assert "NMI = 2 I / (H(Omega) + H(C))" in markdown and "sec. 4, Evaluation metrics" in markdown
    assert "Training batches:" in markdown and "resumed" not in markdown
    report = json.loads((straight / "reproduction.json").read_text())
    assert report["columns"] == ["recall@1", "recall@2", "recall@4", "recall@8", "nmi", "map@r"]
    assert report["queries"] == 16  # the 4 test classes x 4 images
    assert all(0 <= report["ours"][name] <= 100 for name in report["columns"])
    assert report["difference"]["recall@1"] == pytest.approx(report["ours"]["recall@1"] - 66.7)
    assert (
        report["difference"]["map@r"] is None and "MAP@R" in report["citation"]["missing"]["map@r"]
    )
    assert report["selection"]["selected_by"] == "test/recall@1"
    assert report["nmi"]["average"] == "arithmetic"
    assert report["wall_seconds"]["total"] > 0 and report["device"]
    # the precision the training ran in, recorded and printed (amp=false: fp32)
    assert report["precision"] == "fp32" and "bf16 autocast off" in report["precision_detail"]
    assert "Precision: fp32 (bf16 autocast off" in markdown
    assert report["difference_final_step"]["recall@1"] == pytest.approx(row[0] - 66.7)
    assert report["difference_final_step"]["map@r"] is None  # the paper has no MAP@R
    # "as the paper" only of the row that follows the paper's own choice of network
    for reports, follows in (("final", "the row 'ours, final step' follows that protocol"),
                             ("best", "the row 'ours' follows that protocol")):  # fmt: skip
        report["selection"].update(paper=reports, paper_source="where it says so")
        assert f"(where it says so): {follows}" in render(report)
        # ours - paper of the final network too, unless the paper reports its best one
        assert ("| ours, final step - paper |" in render(report)) == (reports == "final")
    # "as the paper" of NMI only where the paper reports one
    report["paper"]["nmi"] = None
    assert "the paper reports no NMI" in render(report)
    assert "mean of the two entropies, as the paper" not in render(report)

    # killed (SIGKILL) once training has written its first checkpoint, then run again
    killed = tmp_path / "killed"
    with started(reproduce(cub, killed), env=ENV, stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL) as process:  # fmt: skip
        deadline = time.monotonic() + 300
        while not (killed / "train" / "last.pt").exists():
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert not (killed / "train" / "result.json").exists()  # killed during training
    again = subprocess.run(reproduce(cub, killed), env=ENV, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "train: resuming" in again.stderr and "resumed from" in again.stderr
    assert table(killed) == table(straight)
    resumed = (killed / "reproduction.md").read_text()
    assert "the training was resumed: the invocations before the last are not counted" in resumed
    assert "over the whole training, every invocation included" in resumed

    # a third run finds every stage complete and prints the same table
    third = subprocess.run(reproduce(cub, killed), env=ENV, capture_output=True, text=True)
    assert third.returncode == 0, third.stderr[-3000:]
    for stage in ("train", "export", "index", "eval"):
        assert f"{stage}: complete, skipped" in third.stderr
    assert table(killed) == table(straight)


def test_a_run_folder_of_other_settings_is_refused(cub, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "reproduce.json").write_text(json.dumps({"identity": {"config": "rll_cub"}}))
    code, _, err = run(capsys, "reproduce", "rankmi_cub", "--root", cub, "--out", out, *SETS)
    assert_one_line_error(code, err, "holds a reproduction of other settings")
    other = tmp_path / "other"
    other.mkdir()
    (other / "mine.txt").write_text("keep")
    code, _, err = run(capsys, "reproduce", "rankmi_cub", "--root", cub, "--out", other, *SETS)
    assert_one_line_error(code, err, "is not a reproduction")
    code, _, err = run(
        capsys, "reproduce", "no_such_config", "--root", cub, "--out", tmp_path / "x"
    )
    assert_one_line_error(code, err, "config file not found")
    code, _, err = run(capsys, "reproduce", "rankmi_cub", "--root", tmp_path / "nothing",
                       "--out", tmp_path / "y", *SETS)  # fmt: skip
    assert_one_line_error(code, err, "not a CUB-200-2011 folder")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_model_selection_protocols(tmp_path):
    def overrides(selection: str, **extra) -> dict:
        repro = Reproduction("rankmi_cub", tmp_path, tmp_path / "run", dict(extra), selection)
        return repro.training_overrides()

    assert overrides("test")["data.val_classes"] == 0  # best on test
    assert overrides("val")["data.val_classes"] == 0.1  # held-out training classes
    assert overrides("val", **{"data.val_classes": 5})["data.val_classes"] == 5
    with pytest.raises(NearsightError, match="--selection val"):
        overrides("test", **{"data.val_classes": 0.2})
    # the training's evaluations report NMI as the paper defines it
    assert overrides("test")["nmi_average"] == "arithmetic"
    geometric = Reproduction("bcontrastive_cub", tmp_path, tmp_path / "run")
    assert geometric.training_overrides()["nmi_average"] == "geometric"


def test_missing_imagenet_weights_name_the_way_out_before_any_file(cub, tmp_path, empty_hub,
                                                                    no_network, capsys):  # fmt: skip
    sets = SETS[: SETS.index("--pretrained")]  # the config's own: ImageNet weights
    out = tmp_path / "run"
    code, _, err = run(capsys, "reproduce", "rankmi_cub", "--root", cub, "--out", out, *sets)
    assert_one_line_error(code, err, "ImageNet weights for resnet50", "--pretrained none",
                          "--pretrained FILE.pth")  # fmt: skip
    assert not out.exists()
    # the way out the error names is an option of reproduce
    with pytest.raises(SystemExit):
        run(capsys, "reproduce", "--help")
    assert "--pretrained WEIGHTS" in capsys.readouterr().out


def test_reproduce_under_torchrun_with_the_honest_selection(cub, tmp_path):
    """Two CPU processes (gloo): distributed training, the index build's process group, and
    process 0's report; best.pt chosen on a held-out training class, with the papers' choice
    (the best test evaluation) beside it."""
    out = tmp_path / "ddp"
    command = reproduce(cub, out, "--selection", "val", "--set", "data.val_classes=1")
    done = torchrun(command[1:], tmp_path / "tmp", env=ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "reproduction.json").read_text())
    assert report["processes"] == 2 and report["queries"] == 16
    assert "2 processes (torchrun)" in (out / "reproduction.md").read_text()
    assert json.loads((out / "train" / "result.json").read_text())["steps"] == 8
    assert report["selection"]["selected_by"] == "val/recall@1"
    evaluations = [json.loads(line) for line in (out / "train" / "metrics.jsonl").open()]
    best_test = max(e["recall@1"] for e in evaluations)
    assert report["ours_best_test"]["recall@1"] == pytest.approx(100 * best_test)
    markdown = (out / "reproduction.md").read_text()
    assert "| ours, best test evaluation |" in markdown and "| ours, final step |" in markdown
    # training on the classes it does not hold out is a difference from the paper
    assert "- `--selection val`: 1 training class held out (data.val_classes = 1)" in markdown
