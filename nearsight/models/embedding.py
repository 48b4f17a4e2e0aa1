"""The embedding network: torchvision ResNet trunk, global pooling, linear head, L2 norm.

This is the network of the deep-metric-learning papers nearsight reproduces: an ImageNet
ResNet-50 without its classifier, global pooling over the last feature map, one linear layer to
the embedding dimension, and L2 normalisation, so that inner product = cosine similarity.

Design decisions
- Input is float RGB in [0, 1], shape [N, 3, H, W]. ImageNet mean/std normalisation happens
  INSIDE ``forward`` (non-persistent buffers), so training, the torch Embedder and the exported
  ONNX graph share one normalisation and no caller can forget or double it.
- Pooling: ``avg`` (global average, the papers'), ``max`` (global max), or ``avgmax``: the SUM
  of the two, as in common DML code (e.g. Proxy-Anchor's and Roth et al.'s ResNet-50 wrappers);
  the sum keeps the 2048-d width, so the head is the same size for all three.
- Head ``embedding``: nn.Linear(2048, dim) with Kaiming-normal weights (fan_out) and zero bias,
  the initialisation Proxy-Anchor and Roth et al. use for this layer.
- ``feature_norm``: ``batchnorm`` puts a BatchNorm1d without affine weights between the pooled
  features and the head (at inference a fixed affine map, so the head stays linear); ``auto``
  (the default) picks it exactly when training from scratch. Why: the pooled features of a
  randomly initialised ResNet-50 share one dominant direction (mean cosine 0.99 between
  the synthetic test images' embeddings under torchvision's default initialisation, 0.6
  between noise images with zero_init_residual), and a loss on the unit sphere spends its
  first hundreds of steps undoing that; standardised features start spread out. Pretrained
  features do not have that problem and the papers' head is a plain linear layer, so ``auto``
  leaves it out there.
- The trunk is built with torchvision's ``zero_init_residual``: the last BatchNorm of every
  residual block starts at zero, so an untrained ResNet-50 starts as a shallow network and
  trains from scratch much faster (Goyal et al. 2017). Pretrained weights overwrite it.
- ``freeze_bn``: every BatchNorm2d of the trunk stays in eval mode (running statistics frozen,
  batch statistics unused) even under ``model.train()``; their affine weights still train.
  Small per-class batches make BatchNorm statistics noisy, which is why DML code freezes them.
- Multi-level heads (``heads``, the RLL and ICE papers' "L, M, H" embeddings): each listed
  trunk stage gets its own global pooling, ``feature_norm`` and linear head of ``dim``, all
  trained under the loss at once (nearsight/training/trainer.py sums the loss over them). The default
  ``[layer4]`` is the single head above; the papers' setting on ResNet-50 is
  ``[layer2, layer3, layer4]``. ``embedding`` says what the network serves (evaluation,
  export, galleries): ``last``, the layer4 head alone, or ``concat``, the L2-normalised
  concatenation of every head's unit embedding (dim = dim x number of heads).
- State-dict keys are ``trunk.<torchvision name>``, ``feature_norm.*`` (running statistics,
  with ``batchnorm``) and ``embedding.{weight,bias}`` for the layer4 head (the same keys as a
  single-head network), and ``side_norms.<stage>.*`` and ``side_embeddings.<stage>.*`` for
  the lower heads.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nearsight.core.errors import NearsightError
from nearsight.models.preprocess import IMAGENET_MEAN, IMAGENET_STD
from nearsight.models.spec import POOLINGS, ModelSpec, spec_from_model_config
from nearsight.models.weights import load_trunk_weights, resolve_pretrained

FEATURE_NORMS = ("auto", "none", "batchnorm")
# torchvision ResNets whose children up to layer4 form the trunk -> width of layer4's output
ARCHS: dict[str, int] = {"resnet18": 512, "resnet34": 512, "resnet50": 2048, "resnet101": 2048}
TRUNK_LAYERS = ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4")
# trunk stages that can carry an embedding head, from low to high
HEAD_STAGES = ("layer1", "layer2", "layer3", "layer4")
EMBEDDINGS = ("last", "concat")


def stage_width(arch: str, stage: str) -> int:
    """Channels of a ResNet stage's output: each stage halves the next one's width."""
    return ARCHS[arch] >> (len(HEAD_STAGES) - 1 - HEAD_STAGES.index(stage))


def check_heads(heads: object, embedding: object) -> list[str]:
    """``heads`` as a list of stage names, low to high, ending at layer4; a clear error for
    anything else."""
    if isinstance(heads, str):
        heads = [heads]
    if not isinstance(heads, (list, tuple)) or not heads:
        raise NearsightError(f"heads must be a non-empty list of trunk stages, got {heads!r}")
    heads = [str(stage) for stage in heads]
    unknown = [stage for stage in heads if stage not in HEAD_STAGES]
    if unknown:
        raise NearsightError(
            f"heads: unknown stage(s) {', '.join(unknown)} (stages: {', '.join(HEAD_STAGES)})"
        )
    order = [HEAD_STAGES.index(stage) for stage in heads]
    if order != sorted(set(order)) or heads[-1] != "layer4":
        raise NearsightError(
            f"heads must list distinct stages from low to high, ending at layer4, got {heads}"
        )
    if embedding not in EMBEDDINGS:
        raise NearsightError(f"embedding must be one of {', '.join(EMBEDDINGS)}, got {embedding!r}")
    return heads


def output_dim(model_config: Mapping[str, Any]) -> int:
    """The dimension of what a network with this (stored) config serves: ``dim``, or
    ``dim`` x the number of heads for the ``concat`` embedding (the spec's rule)."""
    return spec_from_model_config(model_config).output_dim


def resolve_feature_norm(feature_norm: str, pretrained: str) -> str:
    """``none`` or ``batchnorm``: ``auto`` means batchnorm exactly when training from scratch
    (``pretrained`` is "none"); see the module docstring for why."""
    if feature_norm not in FEATURE_NORMS:
        raise NearsightError(
            f"feature_norm must be one of {', '.join(FEATURE_NORMS)}, got {feature_norm!r}"
        )
    if feature_norm == "auto":
        return "batchnorm" if pretrained == "none" else "none"
    return feature_norm


@dataclass
class EmbeddingConfig:
    """Everything needed to rebuild the network; stored in every checkpoint."""

    dim: int = ModelSpec.dim
    pooling: str = "avg"  # avg | max | avgmax (avg + max, summed)
    # "imagenet" (= IMAGENET1K_V1, the papers'), "imagenet-v1", "imagenet-v2", "none", or a
    # path to a .pth file (see nearsight/models/weights.py)
    pretrained: str = "none"
    freeze_bn: bool = False
    image_size: int = ModelSpec.image_size  # training and export size; forward takes any >= 32
    arch: str = ModelSpec.arch
    # none | batchnorm | auto (batchnorm when pretrained is "none"); stored resolved
    feature_norm: str = "auto"
    # trunk stages with an embedding head, low to high, ending at layer4 (the papers'
    # multi-level setting: [layer2, layer3, layer4]); each head has `dim` dimensions
    heads: list[str] = dataclasses.field(default_factory=lambda: ["layer4"])
    # what the network serves: last (the layer4 head) | concat (all heads, dim x len(heads))
    embedding: str = "last"

    def __post_init__(self) -> None:
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or self.dim <= 0:
            raise NearsightError(f"embedding dim must be a positive integer, got {self.dim!r}")
        if self.pooling not in POOLINGS:
            raise NearsightError(
                f"pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}"
            )
        if not isinstance(self.pretrained, str) or not self.pretrained:
            raise NearsightError(f"pretrained must be a name or a path, got {self.pretrained!r}")
        if not isinstance(self.freeze_bn, bool):
            raise NearsightError(f"freeze_bn must be true or false, got {self.freeze_bn!r}")
        if (
            isinstance(self.image_size, bool)
            or not isinstance(self.image_size, int)
            or self.image_size < 32
        ):
            raise NearsightError(f"image size must be an integer >= 32, got {self.image_size!r}")
        if self.arch not in ARCHS:
            raise NearsightError(f"arch must be one of {', '.join(ARCHS)}, got {self.arch!r}")
        self.feature_norm = resolve_feature_norm(self.feature_norm, self.pretrained)
        self.heads = check_heads(self.heads, self.embedding)

    @property
    def output_dim(self) -> int:
        """The dimension of the served embedding (``dim`` x heads for ``concat``)."""
        return output_dim(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def spec(self, test_resize: int | None = None) -> ModelSpec:
        """The :class:`ModelSpec` of the network this config builds (``test_resize``: the
        test-time short side; None: the default ratio)."""
        return spec_from_model_config(self.to_dict(), test_resize)

    @classmethod
    def from_spec(cls, spec: ModelSpec, **training: Any) -> EmbeddingConfig:
        """The config of a network with ``spec``; ``training``: pretrained, freeze_bn."""
        return cls(
            dim=spec.dim,
            pooling=spec.pooling,
            image_size=spec.image_size,
            arch=spec.arch,
            feature_norm=spec.feature_norm,
            heads=list(spec.heads),
            embedding=spec.embedding,
            **training,
        )

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> EmbeddingConfig:
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise NearsightError(
                f"unknown embedding setting(s): {', '.join(map(str, unknown))} "
                f"(known: {', '.join(sorted(known))})"
            )
        return cls(**dict(values))


class EmbeddingNet(nn.Module):
    """images float [N, 3, H, W] in [0, 1] RGB -> embeddings [N, dim], unit L2 norm."""

    def __init__(self, config: EmbeddingConfig | None = None) -> None:
        super().__init__()
        self.config = config if config is not None else EmbeddingConfig()
        from torchvision import models as tv_models

        resnet = getattr(tv_models, self.config.arch)(weights=None, zero_init_residual=True)
        self.trunk = nn.Sequential(
            OrderedDict((name, getattr(resnet, name)) for name in TRUNK_LAYERS)
        )
        self.pooling = self.config.pooling
        self.feature_norm, self.embedding = self._head(ARCHS[self.config.arch])
        # the lower heads of a multi-level network (none by default)
        self.side_norms = nn.ModuleDict()
        self.side_embeddings = nn.ModuleDict()
        for stage in self.config.heads[:-1]:
            norm, linear = self._head(stage_width(self.config.arch, stage))
            self.side_norms[stage], self.side_embeddings[stage] = norm, linear
        mean = torch.tensor(IMAGENET_MEAN, dtype=torch.float32).view(1, 3, 1, 1)
        std = torch.tensor(IMAGENET_STD, dtype=torch.float32).view(1, 3, 1, 1)
        self.register_buffer("mean", mean, persistent=False)
        self.register_buffer("std", std, persistent=False)

    def _head(self, width: int) -> tuple[nn.Module, nn.Linear]:
        """One head's ``feature_norm`` and linear layer on ``width`` pooled features."""
        norm: nn.Module = (
            nn.BatchNorm1d(width, affine=False)
            if self.config.feature_norm == "batchnorm"
            else nn.Identity()
        )
        linear = nn.Linear(width, self.config.dim)
        nn.init.kaiming_normal_(linear.weight, mode="fan_out")
        nn.init.zeros_(linear.bias)
        return norm, linear

    @property
    def dim(self) -> int:
        """The dimension of the served embedding (``forward``'s output)."""
        return self.config.output_dim

    def _pool(self, features: torch.Tensor) -> torch.Tensor:
        if self.pooling == "avg":
            pooled = F.adaptive_avg_pool2d(features, 1)
        elif self.pooling == "max":
            pooled = F.adaptive_max_pool2d(features, 1)
        else:
            pooled = F.adaptive_avg_pool2d(features, 1) + F.adaptive_max_pool2d(features, 1)
        # flatten (not view): the pooled map may be channels_last-strided
        return torch.flatten(pooled, 1)

    def head_embeddings(self, images: torch.Tensor) -> list[torch.Tensor]:
        """Every head's unit embedding [N, dim], low to high (the last is layer4's)."""
        x = (images - self.mean) / self.std
        outputs = []
        for name, layer in self.trunk.named_children():
            x = layer(x)
            if name in self.side_embeddings:
                features = self.side_norms[name](self._pool(x))
                outputs.append(F.normalize(self.side_embeddings[name](features), p=2, dim=1))
        features = self.feature_norm(self._pool(x))
        outputs.append(F.normalize(self.embedding(features), p=2, dim=1))
        return outputs

    def forward(
        self, images: torch.Tensor, all_heads: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The served embedding [N, self.dim]; ``all_heads=True`` (training) gives every
        head's embedding instead, as a tuple, low to high."""
        heads = self.head_embeddings(images)
        if all_heads:
            return tuple(heads)
        if self.config.embedding == "concat" and len(heads) > 1:
            return F.normalize(torch.cat(heads, dim=1), p=2, dim=1)
        return heads[-1]

    @torch.no_grad()
    def fold_feature_norm(self) -> None:
        """Fold each head's eval-mode ``feature_norm`` into its linear layer
        (W' = W / sigma, b' = b - W' mu), leaving the same function as one linear layer: what
        export does, so the ONNX graph and its int8 quantisation see the papers' plain head.
        For inference only: the statistics stop updating."""
        self.feature_norm = _fold(self.feature_norm, self.embedding)
        for stage in list(self.side_norms):
            self.side_norms[stage] = _fold(self.side_norms[stage], self.side_embeddings[stage])

    def trunk_parameters(self) -> Iterator[nn.Parameter]:
        """The pretrained ResNet layers (the trainer gives them the smaller learning rate)."""
        return self.trunk.parameters()

    def head_parameters(self) -> Iterator[nn.Parameter]:
        """The new layers: the linear embedding head(s)."""
        yield from self.embedding.parameters()
        yield from self.side_embeddings.parameters()

    def train(self, mode: bool = True) -> EmbeddingNet:
        super().train(mode)
        if mode and self.config.freeze_bn:
            for module in self.trunk.modules():
                if isinstance(module, nn.BatchNorm2d):
                    module.eval()
        return self


@torch.no_grad()
def _fold(norm: nn.Module, linear: nn.Linear) -> nn.Module:
    """Fold a BatchNorm1d ``norm`` into ``linear`` in place; returns what replaces ``norm``."""
    if not isinstance(norm, nn.BatchNorm1d):
        return norm
    scale = torch.rsqrt(norm.running_var + norm.eps)
    weight = linear.weight * scale[None, :]
    linear.bias.sub_(weight @ norm.running_mean)
    linear.weight.copy_(weight)
    return nn.Identity()


def build_embedding_net(config: EmbeddingConfig | None = None) -> EmbeddingNet:
    """A new EmbeddingNet with its trunk initialised per ``config.pretrained``."""
    config = config if config is not None else EmbeddingConfig()
    net = EmbeddingNet(config)
    state = resolve_pretrained(config.pretrained, config.arch)
    if state is not None:
        load_trunk_weights(net.trunk, state, source=f"--pretrained {config.pretrained}")
    return net
