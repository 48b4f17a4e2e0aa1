"""One registry for every loss: name -> class, with its public parameters checked."""

from __future__ import annotations

import importlib
from typing import Any

from torch import nn

from nearsight.core.errors import NearsightError
from nearsight.training.registry_checks import check_parameters, init_parameters

# name -> "module:Class"; modules are imported on first use so that building one loss does not
# import the others (pytorch-metric-learning is only needed by the baselines).
LOSSES: dict[str, str] = {
    # seed losses (docs/losses.md)
    "ice": "nearsight.training.losses.ice:InstanceCrossEntropyLoss",
    "rll": "nearsight.training.losses.rll:RankedListLoss",
    "nra": "nearsight.training.losses.nra:NonlinearRankApproximationLoss",
    "rankmi": "nearsight.training.losses.rankmi:RankMILoss",
    "bcontrastive": "nearsight.training.losses.bcontrastive:BalancedContrastiveLoss",
    # baselines through pytorch-metric-learning
    "contrastive": "nearsight.training.losses.contrastive:ContrastiveLoss",
    "triplet": "nearsight.training.losses.triplet:SemiHardTripletLoss",
    "margin": "nearsight.training.losses.margin:MarginLoss",
    "multisimilarity": "nearsight.training.losses.multisimilarity:MultiSimilarityLoss",
    "lifted": "nearsight.training.losses.lifted:LiftedStructureLoss",
    "npairs": "nearsight.training.losses.npairs:NPairsLoss",
    # proxy baselines: trainable class proxies (their own parameters, see losses/_proxy.py)
    "proxyanchor": "nearsight.training.losses.proxyanchor:ProxyAnchorLoss",
    "normsoftmax": "nearsight.training.losses.normsoftmax:NormSoftmaxLoss",
    "arcface": "nearsight.training.losses.arcface:ArcFaceLoss",
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
    return init_parameters(loss_class(name))


def build_loss(name: str, **params: Any) -> nn.Module:
    """Build loss ``name`` with keyword ``params``; unknown names or parameters raise
    :class:`LossConfigError` listing the valid ones."""
    cls = loss_class(name)
    check_parameters("loss", name, loss_parameters(name), params, LossConfigError)
    return cls(**params)
