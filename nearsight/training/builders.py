"""Build a run's parts from its configuration: the network, sampler, loss and optimisers."""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from nearsight.models.embedding import EmbeddingConfig, EmbeddingNet, build_embedding_net
from nearsight.models.spec import network_values
from nearsight.training.config import TrainConfig
from nearsight.training.loss_roles import JointParameterLoss, parameter_role
from nearsight.training.losses import build_loss, loss_parameters
from nearsight.training.losses.multihead import PerHeadLoss
from nearsight.training.samplers import build_sampler


def embedding_config(config: TrainConfig) -> EmbeddingConfig:
    """The network's settings in a run's configuration (the trunk's pretrained statistics
    and interpolation filled in: the training transforms read them from here)."""
    model_cfg = config.model
    network = network_values(model_cfg)  # the spec's fields that the model section sets
    network["image_size"] = config.data.image_size  # one size for the data and the network
    return EmbeddingConfig(
        **network, pretrained=model_cfg.pretrained, freeze_bn=bool(model_cfg.freeze_bn)
    )


def build_model(config: TrainConfig, device: torch.device) -> EmbeddingNet:
    """The embedding network, initialised from ``seed`` (and the pretrained weights)."""
    settings = embedding_config(config)
    torch.manual_seed(config.seed)
    model = build_embedding_net(settings)
    model.to(device)
    if device.type == "cuda" and config.channels_last:
        model.to(memory_format=torch.channels_last)
    return model


def sampler_name(config: TrainConfig) -> str:
    """``auto``: the (m,n)-group design for balanced contrastive (its importance weights are
    derived for that design), m-per-class batches for every other loss."""
    if config.sampler.name != "auto":
        return config.sampler.name
    return "group" if config.loss.name == "bcontrastive" else "m_per_class"


def build_train_sampler(config: TrainConfig, labels: list[int]):
    """The batch sampler for ``classes_per_batch`` x ``per_class`` images per batch."""
    design = config.sampler
    name = sampler_name(config)
    images = design.classes_per_batch * design.per_class
    if name == "group":
        kwargs = {"m": design.per_class, "n": design.classes_per_batch}
    elif name == "m_per_class":
        kwargs = {"m": design.per_class, "batch_size": images}
    elif name == "random":
        kwargs = {"batch_pairs": images // 2}
    else:
        kwargs = {}
    kwargs.update(design.params)
    return build_sampler(name, labels, seed=config.seed, **kwargs)


def build_training_loss(config: TrainConfig, sampler: Any) -> nn.Module:
    """The configured loss. Parameters the training data decide are filled in unless the config
    pins them: balanced contrastive's class counts and design (from the sampler), a proxy
    loss's ``class_labels`` (the training classes) and ``embedding_size``, the run's seed.
    A network with several heads gets one instance of the loss per head (``PerHeadLoss``, the
    sum), each with its own parameters; head k's sampling seed is the run's seed + k."""
    heads = len(config.model.heads)
    if heads == 1:
        return _build_one_loss(config, sampler, config.seed)
    loss = PerHeadLoss([_build_one_loss(config, sampler, config.seed + k) for k in range(heads)])
    parameter_role(loss)
    return loss


def _build_one_loss(config: TrainConfig, sampler: Any, seed: int) -> nn.Module:
    params = dict(config.loss.params)
    accepted = loss_parameters(config.loss.name)
    if "class_counts" in accepted and "class_counts" not in params:
        params["class_counts"] = sampler.class_counts()
    if "design" in accepted and "design" not in params:
        params.update(
            {k: v for k, v in sampler.design_params().items() if k in accepted and k not in params}
        )
    for name, value in (
        ("seed", seed),
        ("class_labels", sorted(sampler.class_counts())),
        ("num_classes", max(sampler.class_counts()) + 1),
        ("embedding_size", config.model.dim),
    ):
        if name in accepted and name not in params:
            params[name] = value
    loss = build_loss(config.loss.name, **params)
    parameter_role(loss)  # refuse a loss whose parameters nothing would train
    return loss


def build_optimizer(
    model: EmbeddingNet, loss: nn.Module, config: TrainConfig
) -> torch.optim.Optimizer:
    """The embedding's optimiser: the trunk and the new layers at separate learning rates, as
    the papers set them, plus the groups of a loss whose parameters train jointly (proxies).
    Each group keeps its rate before any schedule as ``base_lr``."""
    optim = config.optim
    groups: list[dict[str, Any]] = [
        {"params": list(model.trunk_parameters()), "lr": optim.lr, "name": "trunk"},
        {"params": list(model.head_parameters()), "lr": optim.head_lr, "name": "head"},
    ]
    if parameter_role(loss) == "joint":
        loss_lr = optim.loss_lr if optim.loss_lr is not None else optim.head_lr
        # parameter_role() just checked it as a joint loss
        for group in cast(JointParameterLoss, loss).parameter_groups():
            groups.append({"lr": loss_lr, **group, "params": list(group["params"])})
    for group in groups:
        group["base_lr"] = group["lr"]
    assert optim.lr is not None, "config_checks.resolve_defaults fills optim.lr"
    if optim.name == "sgd":
        return torch.optim.SGD(
            groups,
            lr=optim.lr,
            momentum=optim.momentum,
            weight_decay=optim.weight_decay,
            fused=on_cuda(groups) or None,  # one kernel per group; the CPU keeps its loop
        )
    cls = torch.optim.AdamW if optim.name == "adamw" else torch.optim.Adam
    return cls(groups, lr=optim.lr, weight_decay=optim.weight_decay, fused=fused_adam(groups))


def fused_adam(groups: list[dict[str, Any]]) -> bool:
    """Adam's fused kernel (one pass over each tensor, where foreach makes several) where
    torch has it for every parameter: floating point, on the CPU or CUDA. Same update rule."""
    params = [p for group in groups for p in group["params"]]
    return bool(params) and all(
        p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params
    )


def on_cuda(groups: list[dict[str, Any]]) -> bool:
    """Whether every parameter is a floating-point CUDA tensor (where fused SGD runs)."""
    params = [p for group in groups for p in group["params"]]
    return bool(params) and all(p.is_floating_point() and p.is_cuda for p in params)


def build_critic_optimizer(loss: nn.Module, config: TrainConfig) -> torch.optim.Optimizer | None:
    """RankMI's statistics network has its own Adam (Algorithm 1); None for other losses."""
    if parameter_role(loss) != "critic":
        return None
    params = list(loss.parameters())
    return torch.optim.Adam(
        params,
        lr=config.optim.critic_lr,
        weight_decay=config.optim.critic_weight_decay,
        # fused on CUDA (one kernel for the critic's tensors); the CPU keeps its loop
        fused=on_cuda([{"params": params}]) or None,
    )
