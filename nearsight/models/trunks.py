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

from dataclasses import dataclass

from nearsight.models.spec import ModelSpec, is_timm

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


def trunk_family(arch: object) -> ResNetFamily | TimmFamily:
    """The family of a trunk (a config's ``model.arch``) or of a ``--model`` value."""
    return TIMM if is_timm(arch) else RESNETS
