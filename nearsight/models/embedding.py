"""The embedding network: a trunk (torchvision ResNet or any timm model), global pooling, a
linear head, L2 norm.

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
  While training they compute their affine map directly (:mod:`nearsight.models.frozen_norm`).
- Multi-level heads (``heads``, the RLL and ICE papers' "L, M, H" embeddings): each listed
  trunk stage gets its own global pooling, ``feature_norm`` and linear head of ``dim``, all
  trained under the loss at once (nearsight/training/trainer.py sums the loss over them). The default
  ``[layer4]`` is the single head above; the papers' setting on ResNet-50 is
  ``[layer2, layer3, layer4]``. ``embedding`` says what the network serves (evaluation,
  export, galleries): ``last``, the layer4 head alone, or ``concat``, the L2-normalised
  concatenation of every head's unit embedding (dim = dim x number of heads).
- timm trunks (``arch: timm:NAME``, :mod:`nearsight.models.timm_trunk`): the same heads, norm
  and normalisation around timm's model without its classifier; pooling suits the family
  (feature maps: avg, max, avgmax, gem; transformers: the class token or a pool over the
  patch tokens), the input normalisation is the pretrained config's ``mean``/``std`` and
  ``head: none`` serves the pooled features themselves (a zero-shot gallery of the pretrained
  model). Lower heads sit on timm's ``feature_info`` stages.
- State-dict keys are ``trunk.<torchvision or timm name>``, ``feature_norm.*`` (running statistics,
  with ``batchnorm``) and ``embedding.{weight,bias}`` for the layer4 head (the same keys as a
  single-head network), and ``side_norms.<stage>.*`` and ``side_embeddings.<stage>.*`` for
  the lower heads (a timm stage's dots as underscores: ``stages_2``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from nearsight.models.embedding_config import (  # noqa: F401  (re-exported: the network's settings)
    ARCHS,
    FEATURE_NORMS,
    HEAD_STAGES,
    TRUNK_LAYERS,
    EmbeddingConfig,
    check_arch,
    check_heads,
    output_dim,
    resolve_feature_norm,
    stage_width,
    trunk_width,
)
from nearsight.models.frozen_norm import freeze_batch_norms
from nearsight.models.pooling import pool_map
from nearsight.models.preprocess import IMAGENET_MEAN, IMAGENET_STD
from nearsight.models.timm_trunk import create_trunk, trunk_features
from nearsight.models.trunks import trunk_family
from nearsight.models.weights import load_trunk_weights, resolve_pretrained


class EmbeddingNet(nn.Module):
    """images float [N, 3, H, W] in [0, 1] RGB -> embeddings [N, dim], unit L2 norm."""

    mean: torch.Tensor  # the input normalisation's buffers [1, 3, 1, 1]
    std: torch.Tensor

    def __init__(
        self, config: EmbeddingConfig | None = None, trunk: nn.Module | None = None
    ) -> None:
        """``trunk``: a timm trunk already built (with its pretrained weights) for ``config``;
        by default the trunk is built randomly initialised."""
        super().__init__()
        self.config = config if config is not None else EmbeddingConfig()
        arch = self.config.arch
        self.timm = trunk_family(arch).timm_info(arch)
        if self.timm is not None:
            self.trunk = trunk if trunk is not None else create_trunk(arch, self.config.image_size)
            side_widths = [self.timm.stage_width(stage) for stage in self.config.heads[:-1]]
        else:
            from torchvision import models as tv_models

            resnet = getattr(tv_models, arch)(weights=None, zero_init_residual=True)
            self.trunk = nn.Sequential(
                OrderedDict((name, getattr(resnet, name)) for name in TRUNK_LAYERS)
            )
            side_widths = [stage_width(arch, stage) for stage in self.config.heads[:-1]]
        self.pooling = self.config.pooling
        self.feature_norm, self.embedding = self._head(trunk_width(arch))
        # the lower heads of a multi-level network (none by default)
        self.side_norms = nn.ModuleDict()
        self.side_embeddings = nn.ModuleDict()
        for stage, width in zip(self.config.heads[:-1], side_widths, strict=True):
            key = _key(stage)
            self.side_norms[key], self.side_embeddings[key] = self._head(width)
        mean = torch.tensor(self.config.mean or IMAGENET_MEAN, dtype=torch.float32)
        std = torch.tensor(self.config.std or IMAGENET_STD, dtype=torch.float32)
        self.register_buffer("mean", mean.view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", std.view(1, 3, 1, 1), persistent=False)

    def _head(self, width: int) -> tuple[nn.Module, nn.Module]:
        """One head's ``feature_norm`` and linear layer on ``width`` pooled features (for
        ``head: none``, nothing: the features themselves)."""
        if self.config.head == "none":
            return nn.Identity(), nn.Identity()
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

    def pooled_features(self, images: torch.Tensor) -> list[torch.Tensor]:
        """Every head's pooled trunk features [N, width], low to high."""
        x = (images - self.mean) / self.std
        if self.timm is not None:
            return trunk_features(self.trunk, self.timm, x, self.config.heads[:-1], self.pooling)
        pooled = []
        for name, layer in self.trunk.named_children():
            x = layer(x)
            if name in self.side_embeddings:
                pooled.append(_flat_pool(x, self.pooling))
        pooled.append(_flat_pool(x, self.pooling))
        return pooled

    def head_embeddings(self, images: torch.Tensor) -> list[torch.Tensor]:
        """Every head's unit embedding [N, dim], low to high (the last is layer4's)."""
        features = self.pooled_features(images)
        outputs = []
        for stage, pooled in zip(self.config.heads[:-1], features, strict=False):
            key = _key(stage)
            embedded = self.side_embeddings[key](self.side_norms[key](pooled))
            outputs.append(F.normalize(embedded, p=2, dim=1))
        embedded = self.embedding(self.feature_norm(features[-1]))
        outputs.append(F.normalize(embedded, p=2, dim=1))
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
        """The pretrained trunk's layers (the trainer gives them the smaller learning rate)."""
        return self.trunk.parameters()

    def head_parameters(self) -> Iterator[nn.Parameter]:
        """The new layers: the linear embedding head(s)."""
        yield from self.embedding.parameters()
        yield from self.side_embeddings.parameters()

    def train(self, mode: bool = True) -> EmbeddingNet:
        super().train(mode)
        if self.config.freeze_bn:
            freeze_batch_norms(self.trunk, training=mode)
        return self


def _key(stage: str) -> str:
    """A stage's key among the side heads (a module name cannot hold a dot)."""
    return stage.replace(".", "_")


def _flat_pool(features: torch.Tensor, pooling: str) -> torch.Tensor:
    # flatten (not view): the pooled map may be channels_last-strided
    return torch.flatten(pool_map(features, pooling), 1)


@torch.no_grad()
def _fold(norm: nn.Module, linear: nn.Module) -> nn.Module:
    """Fold a BatchNorm1d ``norm`` into ``linear`` in place; returns what replaces ``norm``."""
    if not isinstance(norm, nn.BatchNorm1d) or not isinstance(linear, nn.Linear):
        return norm
    assert norm.running_var is not None and norm.running_mean is not None  # eval statistics
    scale = torch.rsqrt(norm.running_var + norm.eps)
    weight = linear.weight * scale[None, :]
    linear.bias.sub_(weight @ norm.running_mean)
    linear.weight.copy_(weight)
    return nn.Identity()


def build_embedding_net(config: EmbeddingConfig | None = None) -> EmbeddingNet:
    """A new EmbeddingNet with its trunk initialised per ``config.pretrained``."""
    config = config if config is not None else EmbeddingConfig()
    if trunk_family(config.arch).timm_info(config.arch) is not None:
        from nearsight.models.timm_weights import timm_pretrained_state

        state, source = timm_pretrained_state(config.arch, config.pretrained)
        trunk = create_trunk(config.arch, config.image_size, state, source=source)
        return EmbeddingNet(config, trunk=trunk)
    net = EmbeddingNet(config)
    state = resolve_pretrained(config.pretrained, config.arch)
    if state is not None:
        load_trunk_weights(net.trunk, state, source=f"--pretrained {config.pretrained}")
    return net
