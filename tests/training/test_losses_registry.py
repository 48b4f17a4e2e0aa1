"""The loss registry: every registered loss builds by name and runs; bad names and parameters
fail with a clear message."""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch

from nearsight.core.errors import NearsightError
from nearsight.training.losses.registry import LOSSES, LossConfigError, build_loss, loss_parameters

# written by another helper at the same time: skipped while their module does not exist
OPTIONAL_MODULES = {"rankmi", "bcontrastive"}

# m images per class x n classes: a batch the bcontrastive (m,n)-group design accepts
M_PER_CLASS, N_CLASSES = 4, 6
PROXY_LOSSES = {"proxyanchor", "normsoftmax", "arcface"}


def required_params(name: str) -> dict:
    """Parameters a loss cannot default: the training set's statistics and batch design."""
    if name == "bcontrastive":
        return {
            "class_counts": {label: 20 + label for label in range(10)},
            "design": "group",
            "m": M_PER_CLASS,
            "n": N_CLASSES,
        }
    if name in PROXY_LOSSES:
        return {"class_labels": list(range(N_CLASSES)), "embedding_size": 16}
    return {}


def importable(name: str) -> bool:
    module_name = LOSSES[name].split(":")[0]
    if name in OPTIONAL_MODULES:
        try:
            importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name == module_name:
                return False
            raise
    return True


def test_every_name_of_the_issue_is_registered():
    assert set(LOSSES) == {
        "ice", "rll", "nra", "rankmi", "bcontrastive",
        "contrastive", "triplet", "margin", "multisimilarity", "lifted", "npairs",
        "proxyanchor", "normsoftmax", "arcface",
    }  # fmt: skip


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_builds_with_defaults_and_returns_a_finite_scalar_with_gradient(name):
    if not importable(name):
        pytest.skip(f"{LOSSES[name]} not written yet")
    loss = build_loss(name, **required_params(name))
    module_name, class_name = LOSSES[name].split(":")
    assert type(loss).__name__ == class_name and type(loss).__module__ == module_name
    assert isinstance(loss, torch.nn.Module)
    generator = torch.Generator().manual_seed(0)
    emb = torch.randn(M_PER_CLASS * N_CLASSES, 16, generator=generator)
    emb = torch.nn.functional.normalize(emb, dim=1).requires_grad_(True)
    labels = torch.arange(N_CLASSES).repeat_interleave(M_PER_CLASS)
    torch.manual_seed(0)
    value = loss(emb, labels)
    assert isinstance(value, torch.Tensor) and value.shape == () and torch.isfinite(value)
    value.backward()
    assert emb.grad is not None and torch.isfinite(emb.grad).all()


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_module_docstring_names_the_paper(name):
    if not importable(name):
        pytest.skip(f"{LOSSES[name]} not written yet")
    module = importlib.import_module(LOSSES[name].split(":")[0])
    assert module.__doc__ and len(module.__doc__.strip()) > 80


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("ice", {"scale": 64, "symmetric": False}),
        ("rll", {"alpha": 1.2, "margin": 0.4, "temperature": 10, "lam": 1.0}),
        ("nra", {"alpha": 2.0, "include_anchor": False}),
    ],
)
def test_seed_loss_public_parameters_are_those_of_losses_md(name, expected):
    assert loss_parameters(name) == expected


def test_parameters_reach_the_loss():
    assert build_loss("ice", scale=32, symmetric=True).scale == 32
    assert build_loss("ice", scale=32, symmetric=True).symmetric is True
    rll = build_loss("rll", alpha=1.2, margin=0.4, temperature=10, lam=1.0)
    assert (rll.alpha, rll.margin, rll.temperature, rll.lam) == (1.2, 0.4, 10, 1.0)
    assert build_loss("nra", alpha=3.0).alpha == 3.0
    assert build_loss("contrastive", neg_margin=0.7).loss.neg_margin == 0.7
    assert build_loss("triplet", margin=0.1).miner.margin == 0.1


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(LossConfigError) as caught:
        build_loss("triplett")
    message = str(caught.value)
    assert "'triplett'" in message and "\n" not in message
    for name in LOSSES:
        assert name in message
    assert isinstance(caught.value, NearsightError)


def test_unknown_parameter_lists_the_valid_ones():
    with pytest.raises(LossConfigError) as caught:
        build_loss("rll", alpha=1.2, temprature=10)
    message = str(caught.value)
    assert "'temprature'" in message and "'rll'" in message and "\n" not in message
    for parameter in ("alpha", "margin", "temperature", "lam"):
        assert parameter in message


def test_unknown_parameter_of_a_loss_without_parameters():
    with pytest.raises(LossConfigError, match=r"'npairs' has no parameter 'margin'.*\(none\)"):
        build_loss("npairs", margin=0.5)


def test_every_registered_class_takes_keyword_parameters_only_with_defaults():
    # everything a config can set must be a named parameter the registry can check
    for name in LOSSES:
        if not importable(name):
            continue
        for key, default in loss_parameters(name).items():
            assert default is not inspect.Parameter.empty or key in required_params(name), (
                name,
                key,
            )
