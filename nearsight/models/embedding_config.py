"""The embedding network's configuration (:class:`EmbeddingConfig`) and the checks of its
settings: which trunks exist (torchvision ResNets, ``timm:NAME``), their heads, pooling and
pretrained weights. What the settings mean: :mod:`nearsight.models.embedding`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nearsight.core.errors import NearsightError
from nearsight.models.spec import (
    EMBEDDINGS,
    HEAD_KINDS,
    INTERPOLATIONS,
    NETWORK_FIELDS,
    POOLINGS,
    ModelSpec,
    NetworkFields,
    spec_from_model_config,
)
from nearsight.models.trunks import ARCHS, HEAD_STAGES, trunk_family  # noqa: F401  (re-exported)

FEATURE_NORMS = ("auto", "none", "batchnorm")
# a torchvision ResNet's children up to layer4: its trunk (ARCHS: their widths; HEAD_STAGES:
# the stages that can carry an embedding head, low to high)
TRUNK_LAYERS = ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4")


def stage_width(arch: str, stage: str) -> int:
    """Channels of a ResNet stage's output: each stage halves the next one's width."""
    return ARCHS[arch] >> (len(HEAD_STAGES) - 1 - HEAD_STAGES.index(stage))


def check_heads(heads: object, embedding: object, arch: str = ModelSpec.arch) -> list[str]:
    """``heads`` as a list of stage names, low to high, ending at the last stage (a ResNet's
    layer4; a timm trunk's last ``feature_info`` stage); a clear error for anything else."""
    if isinstance(heads, str):
        heads = [heads]
    if not isinstance(heads, (list, tuple)) or not heads:
        raise NearsightError(f"heads must be a non-empty list of trunk stages, got {heads!r}")
    heads = [str(stage) for stage in heads]
    if embedding not in EMBEDDINGS:
        raise NearsightError(f"embedding must be one of {', '.join(EMBEDDINGS)}, got {embedding!r}")
    return trunk_family(arch).check_heads(arch, heads)


def check_arch(arch: object) -> None:
    """A torchvision ResNet of :data:`ARCHS` or ``timm:NAME`` of a model timm has."""
    if not isinstance(arch, str):
        raise NearsightError(f"arch must be a name, got {arch!r}")
    trunk_family(arch).check_arch(arch)


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


def check_pretrained(pretrained: str, arch: str) -> None:
    """ImageNet weights are torchvision's ResNets'; hub weights are timm's."""
    trunk_family(arch).check_pretrained(arch, pretrained)


def resolve_pooling(pooling: str, arch: str) -> str:
    """``auto``: the pooling of the trunk's own pretrained head (a ResNet's average, a ViT's
    class token...); anything else as given."""
    if pooling != "auto":
        return pooling
    return trunk_family(arch).default_pooling(arch)


def trunk_width(arch: str) -> int:
    """The width of the trunk's pooled output features (what a linear head reads)."""
    return trunk_family(arch).width(arch)


# Settings the spec holds resolved and a config may leave to the trunk: pooling "auto" (a
# ResNet's avg, a timm model's pretrained head's), feature_norm "auto" (batchnorm exactly when
# training from scratch), interpolation, mean and std empty (the trunk's pretraining's). Each
# is stored resolved.
UNRESOLVED = {"pooling": "auto", "feature_norm": "auto", "interpolation": ""}


@dataclass
class EmbeddingConfig(NetworkFields):
    """Everything needed to rebuild the network; stored in every checkpoint. The network's
    fields are :class:`~nearsight.models.spec.ModelSpec`'s (their meanings are there; lists
    here, and the UNRESOLVED ones left to the trunk by default); this adds how training
    starts."""

    pooling: str = "auto"
    feature_norm: str = "auto"
    interpolation: str = ""
    heads: list[str] = field(default_factory=lambda: list(ModelSpec.heads))
    mean: list[float] = field(default_factory=list)
    std: list[float] = field(default_factory=list)

    # ResNets: "imagenet" (= IMAGENET1K_V1, the papers'), "imagenet-v1", "imagenet-v2";
    # timm trunks: "hub" (nearsight/models/timm_weights.py); both: "none", or a weights file
    pretrained: str = "none"
    freeze_bn: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or self.dim <= 0:
            raise NearsightError(f"embedding dim must be a positive integer, got {self.dim!r}")
        if self.pooling not in (*POOLINGS, "auto"):
            raise NearsightError(
                f"pooling must be one of {', '.join(POOLINGS)} or auto, got {self.pooling!r}"
            )
        if not isinstance(self.pretrained, str) or not self.pretrained:
            raise NearsightError(f"pretrained must be a name or a path, got {self.pretrained!r}")
        if not isinstance(self.freeze_bn, bool):
            raise NearsightError(f"freeze_bn must be true or false, got {self.freeze_bn!r}")
        if (
            isinstance(self.image_size, bool)
            or not isinstance(self.image_size, int)
            or self.image_size < 32
        ):  # training and export size; forward takes any >= 32
            raise NearsightError(f"image size must be an integer >= 32, got {self.image_size!r}")
        check_arch(self.arch)
        self.pooling = resolve_pooling(self.pooling, self.arch)
        check_pretrained(self.pretrained, self.arch)
        if self.head not in HEAD_KINDS:
            raise NearsightError(f"head must be one of {', '.join(HEAD_KINDS)}, got {self.head!r}")
        self.heads = check_heads(self.heads, self.embedding, self.arch)
        if self.head == "none":
            if self.feature_norm == "batchnorm" or len(self.heads) > 1:
                raise NearsightError(
                    "head none serves the pooled features: one head, no feature_norm"
                )
            self.feature_norm, self.dim = "none", trunk_width(self.arch)
        self.feature_norm = resolve_feature_norm(self.feature_norm, self.pretrained)
        family = trunk_family(self.arch)
        family.check_pooling(self.arch, self.pooling)
        interpolation, mean, std = family.input_defaults(self.arch)
        self.interpolation = self.interpolation or interpolation
        self.mean, self.std = list(self.mean or mean), list(self.std or std)
        if self.interpolation not in INTERPOLATIONS:
            raise NearsightError(
                f"interpolation must be one of {', '.join(INTERPOLATIONS)}, got {self.interpolation!r}"
            )
        self.mean, self.std = [float(v) for v in self.mean], [float(v) for v in self.std]

    @property
    def output_dim(self) -> int:
        """The dimension of the served embedding (``dim`` x heads for ``concat``)."""
        return output_dim(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def spec(self, test_resize: int | None = None) -> ModelSpec:
        """The :class:`ModelSpec` of the network this config builds (``test_resize``: the
        test-time short side; None: a timm trunk's pretrained crop share, else the default
        ratio)."""
        if test_resize is None:
            test_resize = trunk_family(self.arch).test_resize(self.arch, self.image_size)
        return spec_from_model_config(self.to_dict(), test_resize)

    @classmethod
    def from_spec(cls, spec: ModelSpec, **training: Any) -> EmbeddingConfig:
        """The config of a network with ``spec``; ``training``: pretrained, freeze_bn."""
        values = {name: getattr(spec, name) for name in NETWORK_FIELDS}
        for name in ("heads", "mean", "std"):
            values[name] = list(values[name])
        return cls(**values, **training)

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
