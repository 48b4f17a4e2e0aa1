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
from nearsight.models.timm_trunk import check_pooling, check_timm_heads, is_timm, timm_info
from nearsight.models.weights import IMAGENET_CHOICES, is_imagenet

FEATURE_NORMS = ("auto", "none", "batchnorm")
# torchvision ResNets whose children up to layer4 form the trunk -> width of layer4's output
ARCHS: dict[str, int] = {"resnet18": 512, "resnet34": 512, "resnet50": 2048, "resnet101": 2048}
TRUNK_LAYERS = ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4")
# trunk stages that can carry an embedding head, from low to high
HEAD_STAGES = ("layer1", "layer2", "layer3", "layer4")


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
    if is_timm(arch):
        return check_timm_heads(timm_info(arch), heads)
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
    return heads


def check_arch(arch: object) -> None:
    """A torchvision ResNet of :data:`ARCHS` or ``timm:NAME`` of a model timm has."""
    if is_timm(arch):
        timm_info(str(arch))  # one-line error for a name timm does not have
    elif arch not in ARCHS:
        raise NearsightError(
            f"arch must be one of {', '.join(ARCHS)} or timm:NAME (any timm model), got {arch!r}"
        )


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
    if is_timm(arch) and is_imagenet(pretrained):
        raise NearsightError(
            f"--pretrained {pretrained} names torchvision's ResNet weights; {arch} takes "
            "--pretrained hub (timm's weights, from the Hugging Face cache), none or FILE"
        )
    if not is_timm(arch) and pretrained == "hub":
        choices = "|".join(IMAGENET_CHOICES)
        raise NearsightError(
            f"--pretrained hub is for timm:NAME trunks; {arch} takes --pretrained {choices}, "
            "none or FILE"
        )


def resolve_pooling(pooling: str, arch: str) -> str:
    """``auto``: the pooling of the trunk's own pretrained head (a ResNet's average, a ViT's
    class token...); anything else as given."""
    if pooling != "auto":
        return pooling
    return timm_info(arch).default_pooling if is_timm(arch) else ModelSpec.pooling


def trunk_width(arch: str) -> int:
    """The width of the trunk's pooled output features (what a linear head reads)."""
    return timm_info(arch).width if is_timm(arch) else ARCHS[arch]


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
        if is_timm(self.arch):
            info = timm_info(self.arch)
            check_pooling(info, self.pooling)
            self.interpolation = self.interpolation or info.interpolation
            self.mean, self.std = list(self.mean or info.mean), list(self.std or info.std)
        elif self.pooling == "token":
            raise NearsightError("pooling token needs a transformer trunk (timm:NAME)")
        self.interpolation = self.interpolation or ModelSpec.interpolation
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
        if test_resize is None and is_timm(self.arch):
            test_resize = timm_info(self.arch).test_resize(self.image_size)
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
