"""One registry for every loss: name -> class, with its public parameters checked."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from torch import nn

from models.errors import NearsightError

# name -> "module:Class"; modules are imported on first use so that building one loss does not
# import the others (pytorch-metric-learning is only needed by the baselines).
LOSSES: dict[str, str] = {
    # seed losses (../shared/LOSSES.md)
    "ice": "training.losses.ice:InstanceCrossEntropyLoss",
    "rll": "training.losses.rll:RankedListLoss",
    "nra": "training.losses.nra:NonlinearRankApproximationLoss",
    "rankmi": "training.losses.rankmi:RankMILoss",
    "bcontrastive": "training.losses.bcontrastive:BalancedContrastiveLoss",
    # baselines through pytorch-metric-learning
    "contrastive": "training.losses.contrastive:ContrastiveLoss",
    "triplet": "training.losses.triplet:SemiHardTripletLoss",
    "margin": "training.losses.margin:MarginLoss",
    "multisimilarity": "training.losses.multisimilarity:MultiSimilarityLoss",
    "lifted": "training.losses.lifted:LiftedStructureLoss",
    "npairs": "training.losses.npairs:NPairsLoss",
}


class LossConfigError(NearsightError, ValueError):
    """An unknown loss name or parameter."""


def loss_class(name: str) -> type[nn.Module]:
    """The class registered under ``name``; a clear error lists the valid names."""
    try:
        target = LOSSES[name]
    except KeyError:
        raise LossConfigError(
            f"unknown loss {name!r}; valid losses: {', '.join(sorted(LOSSES))}"
        ) from None
    module_name, class_name = target.split(":")
    return getattr(importlib.import_module(module_name), class_name)


def loss_parameters(name: str) -> dict[str, Any]:
    """The public parameters of loss ``name`` with their defaults (``inspect.Parameter.empty``
    for required ones)."""
    signature = inspect.signature(loss_class(name).__init__)
    return {
        key: param.default
        for key, param in signature.parameters.items()
        if key != "self" and param.kind in (param.KEYWORD_ONLY, param.POSITIONAL_OR_KEYWORD)
    }


def build_loss(name: str, **params: Any) -> nn.Module:
    """Build loss ``name`` with keyword ``params``; unknown names or parameters raise
    :class:`LossConfigError` listing the valid ones."""
    cls = loss_class(name)
    valid = loss_parameters(name)
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise LossConfigError(
            f"loss {name!r} has no parameter {', '.join(map(repr, unknown))}; "
            f"valid parameters: {', '.join(valid) or '(none)'}"
        )
    missing = [k for k, v in valid.items() if v is inspect.Parameter.empty and k not in params]
    if missing:
        raise LossConfigError(f"loss {name!r} needs parameter(s) {', '.join(missing)}")
    return cls(**params)
