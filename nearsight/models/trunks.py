"""Trunk families: what the rest of the code asks about a model's trunk, answered by its
family, so that no layer above ``models/`` asks which kind of trunk it has.

- :class:`ResNetFamily`: torchvision's ResNets (``resnet50``...), ImageNet weights from
  torchvision's cache;
- :class:`TimmFamily`: ``timm:NAME``, any model of timm's catalogue, weights from the Hugging
  Face cache; as a ``--model`` value it is exported to ONNX on demand (a zero-shot gallery).

A ``--model`` value that is a file (a nearsight model, or an ONNX model exported elsewhere) is
the ResNet family's business only as far as :func:`trunk_family` goes: it exports nothing on
demand. torch and timm are imported by the methods that need them, never at import.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from nearsight.core.errors import NearsightError
from nearsight.models.spec import ModelSpec, is_timm

if TYPE_CHECKING:
    from nearsight.models.timm_trunk import TimmInfo

# torchvision ResNets -> width of their pooled output features
ARCHS: dict[str, int] = {"resnet18": 512, "resnet34": 512, "resnet50": 2048, "resnet101": 2048}
HEAD_STAGES = ("layer1", "layer2", "layer3", "layer4")  # a ResNet's stages, low to high


class Trunk(Protocol):
    """What the code asks of a trunk family (every answer keyed by the config's ``arch``)."""

    @property
    def name(self) -> str: ...

    @property
    def exports_on_demand(self) -> bool:
        """Whether a --model value of this family is exported on demand, not loaded."""
        ...

    def check_arch(self, arch: str) -> None: ...

    def width(self, arch: str) -> int: ...

    def timm_info(self, arch: str) -> TimmInfo | None: ...

    def check_heads(self, arch: str, heads: list[str]) -> list[str]: ...

    def check_pretrained(self, arch: str, pretrained: str) -> None: ...

    def check_pooling(self, arch: str, pooling: str) -> None: ...

    def input_defaults(self, arch: str) -> tuple[str, Sequence[float], Sequence[float]]: ...

    def cached_pretrained(self, arch: str) -> str: ...

    def default_pooling(self, arch: str) -> str: ...

    def test_resize(self, arch: str, image_size: int) -> int | None: ...

    def scratch_note(self, arch: str) -> str: ...


SCRATCH_NOTE = (
    "nearsight: note: --pretrained auto: no ImageNet weights in torchvision's cache "
    "(torch.hub's checkpoints folder), training from scratch; --pretrained FILE.pth takes others"
)
TIMM_SCRATCH_NOTE = (
    "nearsight: note: --pretrained auto: no weights for {arch} in the Hugging Face cache "
    "({cache}), training from scratch; --pretrained hub downloads them where there is a network"
)


@dataclass(frozen=True)
class ResNetFamily:
    """torchvision's ResNets (and, as a ``--model`` value, any model file)."""

    name: str = "torchvision"
    exports_on_demand: bool = False  # a --model value of this family is a file to load

    def check_arch(self, arch: str) -> None:
        if arch not in ARCHS:
            raise NearsightError(
                f"arch must be one of {', '.join(ARCHS)} or timm:NAME (any timm model), got "
                f"{arch!r}"
            )

    def width(self, arch: str) -> int:
        return ARCHS[arch]

    def timm_info(self, arch: str) -> None:
        return None

    def check_heads(self, arch: str, heads: list[str]) -> list[str]:
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

    def check_pretrained(self, arch: str, pretrained: str) -> None:
        if pretrained == "hub":
            from nearsight.models.weights import IMAGENET_CHOICES

            choices = "|".join(IMAGENET_CHOICES)
            raise NearsightError(
                f"--pretrained hub is for timm:NAME trunks; {arch} takes --pretrained "
                f"{choices}, none or FILE"
            )

    def check_pooling(self, arch: str, pooling: str) -> None:
        if pooling == "token":
            raise NearsightError("pooling token needs a transformer trunk (timm:NAME)")

    def input_defaults(self, arch: str) -> tuple[str, Sequence[float], Sequence[float]]:
        """(interpolation, mean, std) the trunk was pretrained with: the spec's (ImageNet's)."""
        return ModelSpec.interpolation, (), ()

    def cached_pretrained(self, arch: str) -> str:
        """``--pretrained auto``: the ImageNet weights when torchvision has them cached."""
        from nearsight.models.weights import imagenet_cache_path

        return "imagenet" if imagenet_cache_path(arch, "imagenet").exists() else "none"

    def default_pooling(self, arch: str) -> str:
        return ModelSpec.pooling

    def test_resize(self, arch: str, image_size: int) -> int | None:
        """The test-time short side when the config leaves it open: None, the default ratio."""
        return None

    def scratch_note(self, arch: str) -> str:
        """The note printed when ``--pretrained auto`` finds no weights."""
        return SCRATCH_NOTE


@dataclass(frozen=True)
class TimmFamily:
    """``timm:NAME`` trunks."""

    name: str = "timm"
    exports_on_demand: bool = True  # --model timm:NAME: exported to ONNX, then loaded

    def check_arch(self, arch: str) -> None:
        self.timm_info(arch)  # one-line error for a name timm does not have

    def width(self, arch: str) -> int:
        return self.timm_info(arch).width

    def timm_info(self, arch: str) -> TimmInfo:
        from nearsight.models.timm_trunk import timm_info

        return timm_info(arch)

    def check_heads(self, arch: str, heads: list[str]) -> list[str]:
        from nearsight.models.timm_trunk import check_timm_heads

        return check_timm_heads(self.timm_info(arch), heads)

    def check_pretrained(self, arch: str, pretrained: str) -> None:
        from nearsight.models.weights import is_imagenet

        if is_imagenet(pretrained):
            raise NearsightError(
                f"--pretrained {pretrained} names torchvision's ResNet weights; {arch} takes "
                "--pretrained hub (timm's weights, from the Hugging Face cache), none or FILE"
            )

    def check_pooling(self, arch: str, pooling: str) -> None:
        from nearsight.models.timm_trunk import check_pooling

        check_pooling(self.timm_info(arch), pooling)

    def input_defaults(self, arch: str) -> tuple[str, Sequence[float], Sequence[float]]:
        """(interpolation, mean, std) of the pretrained config."""
        info = self.timm_info(arch)
        return info.interpolation, info.mean, info.std

    def cached_pretrained(self, arch: str) -> str:
        """``--pretrained auto``: the hub weights when the Hugging Face cache holds them."""
        from nearsight.models.timm_weights import hub_cached_file

        return "hub" if hub_cached_file(arch) is not None else "none"

    def default_pooling(self, arch: str) -> str:
        from nearsight.models.timm_trunk import timm_info

        return timm_info(arch).default_pooling

    def test_resize(self, arch: str, image_size: int) -> int | None:
        """The pretrained config's crop share."""
        from nearsight.models.timm_trunk import timm_info

        return timm_info(arch).test_resize(image_size)

    def scratch_note(self, arch: str) -> str:
        from nearsight.models.timm_weights import hub_cache_dir

        return TIMM_SCRATCH_NOTE.format(arch=arch, cache=hub_cache_dir())


RESNETS = ResNetFamily()
TIMM = TimmFamily()


def trunk_family(arch: object) -> Trunk:
    """The family of a trunk (a config's ``model.arch``) or of a ``--model`` value: the one
    place that asks which kind of trunk it is."""
    return TIMM if is_timm(arch) else RESNETS
