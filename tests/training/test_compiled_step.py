"""The compiled training step: each loss and the network trace as one graph each (or the loss
names why it cannot), a compiled run on the CPU gives the eager run's losses, and a compiler
failure falls back to the eager step without losing the run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch._dynamo
from helpers import TINY_TRAIN, read_jsonl

from nearsight.data.datasets.synthetic import write_synthetic
from nearsight.training.builders import build_model, build_train_sampler, build_training_loss
from nearsight.training.compiled import loss_compile_note, resolve_compile
from nearsight.training.config import ConfigError, load_config
from nearsight.training.run import train

# the six designs the GPU check measures; RankMI (its pair selection) and Proxy Anchor
# (pytorch-metric-learning's code) have data-dependent shapes: their losses run eagerly
LOSSES = ("ice", "rll", "nra", "rankmi", "bcontrastive", "proxyanchor")
FALLS_BACK = {"rankmi": "data-dependent", "proxyanchor": "data-dependent"}
LABELS = [0, 0, 1, 1, 2, 2]  # the configs' design: 3 classes x 2 images


def config_for(loss: str, root: str = "unused", **extra):
    overrides = {
        **TINY_TRAIN,
        "data.root": root,
        "loss.name": loss,
        "amp": False,
        "channels_last": False,
        "device": "cpu",
        "cpu_threads": 1,
        "eval_every": 10**9,
        "save_every": 10**9,
        "log_every": 1,
        "steps": 3,
        "seed": 3,
        **extra,
    }
    return load_config(None, overrides)


def batch(dim: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    embeddings = torch.nn.functional.normalize(torch.randn(len(LABELS), dim, generator=generator))
    return embeddings.requires_grad_(), torch.tensor(LABELS)


@pytest.mark.parametrize("name", LOSSES)
def test_each_loss_is_one_graph_or_names_why_not(name):
    config = config_for(name)
    loss = build_training_loss(config, build_train_sampler(config, LABELS))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(loss)(*batch())
    note = loss_compile_note(loss)
    if name in FALLS_BACK:
        # the trainer compiles the network alone and runs this loss eagerly, for this reason
        assert explained.graph_break_count > 0
        assert note and FALLS_BACK[name] in note
    else:
        reasons = [str(b.reason) for b in explained.break_reasons]
        assert explained.graph_break_count == 0, f"{name}: {reasons}"
        assert note is None


@pytest.mark.parametrize("heads", [["layer4"], ["layer2", "layer3", "layer4"]])
def test_the_network_is_one_graph_with_one_or_several_heads(heads):
    model = build_model(config_for("ice", **{"model.heads": heads}), torch.device("cpu"))
    torch._dynamo.reset()
    images = torch.rand(4, 3, 32, 32)
    explained = torch._dynamo.explain(model)(images, all_heads=len(heads) > 1)
    assert explained.graph_break_count == 0, [str(b.reason) for b in explained.break_reasons]


def test_compile_setting_resolves_by_device_and_processes():
    assert resolve_compile("auto", cuda=False) is None
    assert resolve_compile("auto", cuda=True) == "default"
    assert resolve_compile("off", cuda=True) is None
    assert resolve_compile("reduce-overhead", cuda=True) == "reduce-overhead"
    assert resolve_compile("default", cuda=True, world=2) is None
    assert resolve_compile(False, cuda=True) is None  # YAML reads `compile: off` as false
    assert resolve_compile(True, cuda=False) == "default"
    assert load_config(None, {"compile": False}).compile is False
    with pytest.raises(ConfigError, match="config compile must be one of auto, off"):
        load_config(None, {"compile": "fast"})


@pytest.fixture(scope="module")
def synth(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("synth") / "data"
    write_synthetic(root, classes=8, per_class=4, size=32, seed=0)
    return root


# the runs compare two ways of stepping one network (the trainer's, whichever its trunk): a
# ResNet-18 trunk traces and steps in a fraction of ResNet-50's time (the network test above
# traces the default trunk)
RUN_TRUNK = {"model.arch": "resnet18"}


def losses_of(run: Path) -> list[float]:
    return [r["loss"] for r in read_jsonl(run / "train.jsonl")]


@pytest.mark.parametrize("loss", ["ice", "rankmi"])
def test_a_compiled_run_gives_the_eager_losses(synth, tmp_path, monkeypatch, loss):
    """The trainer's compiled path on the CPU (dynamo + AOTAutograd, without inductor's code
    generation): multi-level heads for ICE, and RankMI's network-only compile with its
    critic batches."""
    real_compile = torch.compile
    modes = []

    def aot_eager(model, *, mode=None, **options):
        modes.append(mode)
        return real_compile(model, backend="aot_eager", **options)

    heads = {"model.heads": ["layer2", "layer3", "layer4"]} if loss == "ice" else {}
    extra = {**RUN_TRUNK, **heads}
    train(config_for(loss, str(synth), **extra), tmp_path / "eager")
    monkeypatch.setattr(torch, "compile", aot_eager)
    torch._dynamo.reset()
    train(config_for(loss, str(synth), compile="default", **extra), tmp_path / "compiled")
    assert modes == (["default", "default"] if loss == "ice" else ["default"])
    compiled = losses_of(tmp_path / "compiled")
    assert compiled == pytest.approx(losses_of(tmp_path / "eager"), rel=1e-4, abs=1e-5)


def test_a_compiler_failure_falls_back_to_the_eager_step(synth, tmp_path, monkeypatch, caplog):
    def broken(model, **options):
        def fail(*args, **kwargs):
            raise RuntimeError("no compiler here")

        return fail

    train(config_for("nra", str(synth), **RUN_TRUNK), tmp_path / "eager")
    monkeypatch.setattr(torch, "compile", broken)
    train(config_for("nra", str(synth), compile="default", **RUN_TRUNK), tmp_path / "fallback")
    assert losses_of(tmp_path / "fallback") == pytest.approx(losses_of(tmp_path / "eager"))
    assert "torch.compile failed, the step runs eagerly: RuntimeError" in caplog.text
