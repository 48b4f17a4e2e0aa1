"""Errors that give the way out (issue 23 item 6): a training-only command without the [train]
extra names it, batch-shape errors name the flag, config typos get a suggestion, and
`--pretrained auto` is the default, with a note when it trains from scratch."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions

import pytest
from helpers import ROOT, run

from nearsight.core.extras import EXTRA_MODULES
from nearsight.training.config import ConfigError, load_config
from nearsight.training.samplers import SamplerConfigError, build_sampler

# a Python whose torch, torchvision, onnx, scikit-learn, scipy, ... cannot be imported: the
# serving set only (`pip install .`), simulated in this interpreter by an import blocker
BLOCKER = """
import runpy, sys
from importlib.abc import MetaPathFinder

BLOCKED = {blocked!r}

class Blocker(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Blocker())
sys.argv = ["nearsight", *{argv!r}]
runpy.run_module("nearsight.app.cli", run_name="__main__")
"""
# what the [train] and [data] extras bring: not in the serving set
NOT_SERVING = sorted(m for m, extra in EXTRA_MODULES.items() if extra in ("train", "data"))


def without_train_extra(*argv) -> subprocess.CompletedProcess:
    code = BLOCKER.format(blocked=NOT_SERVING, argv=[str(arg) for arg in argv])
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )


def assert_names_the_extra(
    done: subprocess.CompletedProcess, command: str, extra: str = "train"
) -> None:
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert lines[0].startswith(f"nearsight: error: nearsight {command}: ")
    assert f"pip install 'nearsight[{extra}]'" in lines[0]


def test_train_and_export_without_the_extra(tmp_path):
    done = without_train_extra("train", "--dataset", "folder", "--root", tmp_path,
                               "--loss", "ice", "--out", tmp_path / "run")  # fmt: skip
    assert_names_the_extra(done, "train")
    assert not (tmp_path / "run").exists()
    (tmp_path / "best.pt").write_bytes(b"x")
    done = without_train_extra("export", "--checkpoint", tmp_path / "best.pt",
                               "--out", tmp_path / "m.onnx")  # fmt: skip
    assert_names_the_extra(done, "export")


def test_python_export_without_the_extra():
    code = BLOCKER.split("sys.argv")[0] + (
        "import nearsight\n"
        "try:\n"
        "    nearsight.export\n"
        "except nearsight.NearsightError as error:\n"
        "    print(error)\n"
    )
    code = code.format(blocked=NOT_SERVING)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().startswith("nearsight.export: ")
    assert "pip install 'nearsight[train]'" in done.stdout


def test_index_build_of_a_checkpoint_or_cars_without_the_extra(onnx_gallery, tmp_path):
    done = without_train_extra("index", "build", "--model", onnx_gallery.checkpoint,
                               "--images", onnx_gallery.query, "--out", tmp_path / "g")  # fmt: skip
    assert_names_the_extra(done, "index")
    assert "torch is not installed" in done.stderr
    cars = tmp_path / "cars"
    (cars / "car_ims").mkdir(parents=True)
    (cars / "cars_annos.mat").write_bytes(b"")
    done = without_train_extra("index", "build", "--model", onnx_gallery.model, "--dataset",
                               "cars", "--root", cars, "--out", tmp_path / "g")  # fmt: skip
    assert_names_the_extra(done, "index", "data")
    assert "scipy is not installed" in done.stderr
    assert not (tmp_path / "g").exists()


def test_parquet_metadata_without_the_extra(tmp_path):
    import numpy as np

    np.save(tmp_path / "vectors.npy", np.eye(4, dtype=np.float32))
    (tmp_path / "meta.parquet").write_bytes(b"PAR1")
    done = without_train_extra("index", "import", "--vectors", tmp_path / "vectors.npy",
                               "--meta", tmp_path / "meta.parquet", "--out", tmp_path / "g")  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and "pip install 'nearsight[data]'" in done.stderr
    assert not (tmp_path / "g").exists()


def test_every_train_requirement_has_its_module_listed():
    """The [train] extra's distributions are the ones EXTRA_MODULES names (by import name)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {
        re.split(r"[<>=!~ ;\[]", req)[0].lower()
        for req in project["optional-dependencies"]["train"]
    }
    distributions = packages_distributions()  # reads every installed package's file list: once
    provided = {dist.lower() for module in NOT_SERVING for dist in distributions.get(module, [])}
    assert wanted <= provided, wanted - provided


def test_every_data_requirement_names_the_data_extra():
    """The [data] extra's requirements are the modules EXTRA_MODULES sends to [data] (their
    import names are their distribution names)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {re.split(r"[<>=!~ ;\[]", req)[0] for req in project["optional-dependencies"]["data"]}
    assert wanted == {module for module, extra in EXTRA_MODULES.items() if extra == "data"}


@pytest.mark.filterwarnings("ignore:group sampler. leaving out")
@pytest.mark.parametrize(
    ("name", "params", "flags"),
    [
        ("m_per_class", {"batch_size": 16, "m": 2}, ["--classes-per-batch"]),
        ("m_per_class", {"batch_size": 2, "m": 2}, ["--classes-per-batch"]),
        ("group", {"m": 3, "n": 4}, ["--classes-per-batch", "--per-class"]),
    ],
)
def test_batch_shape_errors_name_the_flag(name, params, flags):
    labels = [label for label in range(6) for _ in range(2)]  # 6 classes of 2 images
    with pytest.raises(SamplerConfigError) as caught:
        build_sampler(name, labels, **params)
    for flag in flags:
        assert flag in str(caught.value)


def test_the_six_classes_message_of_the_issue():
    labels = [label for label in range(6) for _ in range(4)]
    with pytest.raises(SamplerConfigError, match="16 classes per batch, but the labels have "
                       "only 6 classes: lower --classes-per-batch"):  # fmt: skip
        build_sampler("m_per_class", labels, batch_size=64, m=4)


@pytest.mark.parametrize(
    ("overrides", "suggestion"),
    [
        ({"optim.lrr": 1e-4}, "did you mean 'optim.lr'?"),
        ({"optm.lr": 1e-4}, "did you mean 'optim.lr'?"),
        ({"model.pretraind": "none"}, "did you mean 'model.pretrained'?"),
        ({"samplr.per_class": 4}, "did you mean 'sampler.per_class'?"),
    ],
)
def test_config_typos_get_a_suggestion(overrides, suggestion):
    with pytest.raises(ConfigError, match=re.escape(suggestion)):
        load_config(None, overrides)


def test_config_file_typos_get_a_suggestion(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("optim:\n  head_lrr: 0.001\n")
    with pytest.raises(
        ConfigError, match=re.escape("'optim.head_lrr' (did you mean 'optim.head_lr'?)")
    ):
        load_config(path)
    with pytest.raises(ConfigError) as caught:
        load_config(None, {"zzzz": 1})
    assert "did you mean" not in str(caught.value)  # nothing close: no guess


def test_pretrained_auto_is_the_default_and_in_the_help(empty_hub, capsys):
    from nearsight.models.weights import imagenet_cache_path

    config = load_config(None)
    assert config.model.pretrained == "none" and "model.pretrained" in config.auto
    cached = imagenet_cache_path("resnet50", "imagenet")
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"")  # only its presence is read here
    assert load_config(None).model.pretrained == "imagenet"
    assert load_config(None, {"model.pretrained": "none"}).model.pretrained == "none"
    with pytest.raises(SystemExit):
        run(capsys, "train", "--help")
    help_text = " ".join(capsys.readouterr().out.split())
    assert "auto | imagenet" in help_text and "default auto" in help_text


def test_training_from_scratch_by_auto_says_so(empty_hub, tmp_path, capsys):
    from helpers import write_digits

    from nearsight.training.run import train

    data = write_digits(tmp_path / "digits", test_per_class=4)
    settings = {"data.dataset": "folder", "data.root": str(data), "data.image_size": 32,
                "data.workers": 0, "model.arch": "resnet18", "model.dim": 8,
                "sampler.classes_per_batch": 2, "sampler.per_class": 2, "steps": 1,
                "eval_every": 1}  # fmt: skip
    train(load_config(None, settings), tmp_path / "run")
    err = capsys.readouterr().err
    assert "--pretrained auto: no ImageNet weights" in err
    train(load_config(None, {**settings, "model.pretrained": "none"}), tmp_path / "run2")
    assert "--pretrained auto" not in capsys.readouterr().err  # chosen, not defaulted
