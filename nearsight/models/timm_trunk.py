"""timm trunks: any model of timm's catalogue (``model.arch: timm:NAME``) as the embedding trunk.

``timm:NAME`` is a timm model name, with or without its pretrained tag
(``timm:vit_small_patch14_dinov2.lvd142m``, ``timm:convnext_tiny.fb_in22k``,
``timm:vit_base_patch16_clip_224.openai``). The trunk is timm's model without its classifier
(``num_classes=0``); the embedding head, the L2 norm and the input normalisation are
nearsight's (:mod:`nearsight.models.embedding`). timm is imported only here and only when such
a trunk is asked for: the serving set never imports it (nor torch).

Two families, told apart by what ``forward_features`` returns:

- ``map`` (CNNs: ConvNeXt, ResNets, EfficientNets...; Swin's NHWC maps too): the final feature
  map is pooled by nearsight (avg, max, avgmax, gem) to one pixel, then passed through timm's
  own ``forward_head(..., pre_logits=True)``, so that whatever the pretrained model does after
  its global pool (ConvNeXt's LayerNorm, MobileNet's conv head) still happens. Lower heads
  (``heads``) read timm's ``feature_info`` stages through ``forward_intermediates``.
- ``tokens`` (ViT, DeiT, DINO/DINOv2, CLIP and EVA towers): the final token sequence is pooled
  to the class token (``token``) or over the patch tokens (avg, max, avgmax, gem), then through
  the model's ``fc_norm`` when it has one (timm puts the last LayerNorm there for mean-pooled
  ViTs). One head only: a transformer has no stages of different scales.

A head is named by timm's ``feature_info`` module (``stages.2``, ``layer3``, ``blocks.11``);
the last head is always the trunk's output (after its final norm), named by the last stage.
The default heads (``[layer4]``, the ResNets' last stage) mean that last stage here too.

:func:`timm_info` builds the model once on the ``meta`` device (no memory, no weights, well
under a second) to read its family, widths, stages and pretrained config: the image size,
mean, std, interpolation and crop that go into the model's spec.
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from nearsight.core.errors import NearsightError
from nearsight.models.pooling import pool_map, pool_tokens
from nearsight.models.spec import INTERPOLATIONS, TIMM_PREFIX

MAP_POOLINGS = ("avg", "max", "avgmax", "gem")
TOKEN_POOLINGS = ("token", "avg", "max", "avgmax", "gem")
# timm's global_pool names -> the pooling that reproduces the pretrained model's own
DEFAULT_POOLING = {"token": "token", "avg": "avg", "max": "max", "avgmax": "avgmax", "": "avg"}


@dataclass(frozen=True)
class TimmInfo:
    """What nearsight needs to know about a timm model before building it."""

    name: str  # the timm name, tag included when given
    kind: str  # map | tokens
    prefix_tokens: int  # class (and register) tokens before the patch tokens
    width: int  # features after pooling and the trunk's own post-pool layers
    stages: tuple[tuple[str, int], ...]  # (feature_info module, channels), low to high
    nhwc: bool  # a map model whose maps are [N, H, W, C] (Swin)
    takes_img_size: bool  # built for an input size (transformers' position embeddings)
    default_pooling: str
    # the pretrained config's
    image_size: int
    mean: tuple[float, ...]  # 3 numbers, R G B
    std: tuple[float, ...]
    interpolation: str
    crop_pct: float
    hf_hub_id: str  # "" when timm has no Hugging Face weights for it
    hf_hub_filename: str  # "" for the hub's default (model.safetensors / pytorch_model.bin)
    classifiers: tuple[str, ...]  # the pretrained classifier's module names (dropped)

    @property
    def stage_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.stages)

    def stage_width(self, stage: str) -> int:
        return dict(self.stages)[stage]

    def test_resize(self, image_size: int) -> int:
        """The short side before the centre crop, from the pretrained crop share (timm's
        ``int(image_size / crop_pct)``)."""
        return int(image_size / self.crop_pct)


def _import_timm():
    try:
        import timm
    except ImportError:  # pragma: no cover - timm is in the [train] extra
        raise NearsightError(
            "timm: trunks need the timm package (pip install 'nearsight[train]')"
        ) from None
    return timm


def _unknown(name: str) -> NearsightError:
    timm = _import_timm()
    base = name.split(".")[0]
    close = difflib.get_close_matches(base, timm.list_models(), n=3)
    hint = f" (did you mean {', '.join('timm:' + c for c in close)}?)" if close else ""
    return NearsightError(
        f"model.arch timm:{name}: timm {timm.__version__} has no such model{hint}"
    )


@functools.lru_cache(maxsize=32)
def timm_info(arch: str) -> TimmInfo:
    """The :class:`TimmInfo` of ``timm:NAME`` (a one-line error for an unknown name)."""
    timm = _import_timm()
    name = arch.removeprefix(TIMM_PREFIX)
    if not name or not timm.is_model(name):
        raise _unknown(name)
    try:
        cfg = timm.models.get_pretrained_cfg(name) or timm.models.get_pretrained_cfg(
            name.split(".")[0]
        )
    except RuntimeError:  # "Invalid pretrained tag (...)"
        raise _unknown(name) from None
    cfg = cfg.to_dict() if cfg is not None else {}
    image_size = int((cfg.get("input_size") or (3, 224, 224))[-1])
    with torch.device("meta"):
        model, takes_img_size = timm_model(name, image_size)
        probe = torch.empty(1, 3, image_size, image_size)
        final = model.forward_features(probe)
        kind = "tokens" if final.dim() == 3 else "map"
        nhwc = kind == "map" and getattr(model, "output_fmt", "NCHW") == "NHWC"
        prefix = int(getattr(model, "num_prefix_tokens", 0) or 0)
        pool = getattr(model, "global_pool", "")
        default = DEFAULT_POOLING.get(pool if isinstance(pool, str) else "avg", "avg")
        if kind == "tokens" and default == "token" and prefix == 0:
            default = "avg"
        if kind == "map":
            default = "avg"
        info_stub = TimmInfo(name, kind, prefix, 0, (), nhwc, takes_img_size, default, image_size,
                             (0, 0, 0), (1, 1, 1), "bicubic", 1.0, "", "", ())  # fmt: skip
        width = int(_pooled(model, info_stub, final, default).shape[1])
    stages = tuple(
        (str(entry["module"]), int(entry["num_chs"]))
        for entry in getattr(model, "feature_info", [])
    )
    interpolation = str(cfg.get("interpolation") or "bicubic")
    classifier = cfg.get("classifier") or ()
    return TimmInfo(
        name=name,
        kind=kind,
        prefix_tokens=prefix,
        width=width,
        stages=stages,
        nhwc=nhwc,
        takes_img_size=takes_img_size,
        default_pooling=default,
        image_size=image_size,
        mean=tuple(float(v) for v in cfg.get("mean") or (0.485, 0.456, 0.406)),
        std=tuple(float(v) for v in cfg.get("std") or (0.229, 0.224, 0.225)),
        interpolation=interpolation if interpolation in INTERPOLATIONS else "bicubic",
        crop_pct=float(cfg.get("crop_pct") or 0.875),
        hf_hub_id=str(cfg.get("hf_hub_id") or ""),
        hf_hub_filename=str(cfg.get("hf_hub_filename") or ""),
        classifiers=(classifier,) if isinstance(classifier, str) else tuple(classifier),
    )


def timm_model(name: str, image_size: int, **kwargs: Any) -> tuple[Any, bool]:
    """timm's model ``name`` without its classifier (``num_classes=0`` unless ``kwargs`` say
    otherwise), for ``image_size`` where it is built for a size: (model, whether it took
    img_size)."""
    timm = _import_timm()
    try:
        return timm.create_model(name, img_size=image_size, **{"num_classes": 0, **kwargs}), True
    except TypeError as error:  # CNNs take any size and no img_size argument
        if "img_size" not in str(error):
            raise
    return timm.create_model(name, **{"num_classes": 0, **kwargs}), False


def create_trunk(
    arch: str,
    image_size: int,
    state_dict: dict[str, torch.Tensor] | None = None,
    *,
    source: str = "",
) -> nn.Module:
    """The timm trunk of ``timm:NAME`` for ``image_size``: randomly initialised, or loaded
    from ``state_dict`` (timm's pretrained weights or a file in timm's key names) through
    timm's own loader, which adapts them (position embeddings resampled to ``image_size``,
    checkpoint formats converted). The pretrained classifier is dropped; every other key must
    match (one-line error naming ``source`` otherwise)."""
    info = timm_info(arch)
    if state_dict is None:
        return timm_model(info.name, image_size, pretrained=False)[0]
    state = dict(state_dict)
    for classifier in info.classifiers:
        for suffix in (".weight", ".bias"):
            state.pop(classifier + suffix, None)
    # num_classes 0 on both sides: timm then loads strictly (nothing popped, nothing skipped)
    overlay = {"state_dict": state, "num_classes": 0}
    try:
        return timm_model(info.name, image_size, pretrained=True, pretrained_cfg_overlay=overlay)[0]
    except (RuntimeError, KeyError, ValueError) as error:
        reason = " ".join(str(error).split())
        reason = reason if len(reason) <= 240 else reason[:237] + "..."
        raise NearsightError(
            f"{source or 'weights'}: do not fit timm:{info.name} ({reason})"
        ) from None


def check_pooling(info: TimmInfo, pooling: str) -> None:
    allowed = TOKEN_POOLINGS if info.kind == "tokens" else MAP_POOLINGS
    if pooling not in allowed:
        raise NearsightError(
            f"pooling {pooling!r} does not fit timm:{info.name} (a {info.kind} trunk: "
            f"{', '.join(allowed)})"
        )
    if pooling == "token" and info.prefix_tokens == 0:
        raise NearsightError(f"pooling token: timm:{info.name} has no class token")


def check_timm_heads(info: TimmInfo, heads: list[str]) -> list[str]:
    """``heads`` checked against the trunk's stages; the default ``[layer4]`` (the ResNets')
    means its last stage."""
    names = info.stage_names
    if not names:  # a model without feature_info: its output alone
        if len(heads) > 1:
            raise NearsightError(f"heads: timm:{info.name} lists no stages: one head")
        return heads
    if heads == ["layer4"] and "layer4" not in names:
        return [names[-1]]
    unknown = [stage for stage in heads if stage not in names]
    if unknown:
        shown = ", ".join(names) if len(names) <= 12 else f"{names[0]} ... {names[-1]}"
        raise NearsightError(
            f"heads: timm:{info.name} has no stage(s) {', '.join(unknown)} (stages: {shown})"
        )
    order = [names.index(stage) for stage in heads]
    if order != sorted(set(order)) or heads[-1] != names[-1]:
        raise NearsightError(
            f"heads must list distinct stages from low to high, ending at {names[-1]}, got {heads}"
        )
    if len(heads) > 1 and info.kind == "tokens":
        raise NearsightError(
            f"heads: timm:{info.name} is a transformer (no stages of different scales): one head"
        )
    return heads


def trunk_features(
    trunk: Any, info: TimmInfo, images: torch.Tensor, side_stages: list[str], pooling: str
) -> list[torch.Tensor]:
    """Pooled features [N, C] of each side stage (low to high), then of the trunk's output."""
    if not side_stages:
        return [_pooled(trunk, info, trunk.forward_features(images), pooling)]
    indices = [info.stage_names.index(stage) for stage in side_stages]
    final, sides = trunk.forward_intermediates(images, indices=indices, norm=False)
    pooled = [torch.flatten(pool_map(side, pooling), 1) for side in sides]
    return [*pooled, _pooled(trunk, info, final, pooling)]


def _pooled(trunk: Any, info: TimmInfo, final: torch.Tensor, pooling: str) -> torch.Tensor:
    if info.kind == "tokens":
        pooled = pool_tokens(final, pooling, info.prefix_tokens)
        fc_norm = getattr(trunk, "fc_norm", None)
        return fc_norm(pooled) if isinstance(fc_norm, nn.Module) else pooled
    if info.nhwc:  # pool as NCHW, hand timm's head the [N, 1, 1, C] it expects
        one_pixel = pool_map(final.permute(0, 3, 1, 2), pooling).permute(0, 2, 3, 1)
    else:
        one_pixel = pool_map(final, pooling)
    # timm's global pool of one pixel is that pixel; then its own norm / conv head
    return torch.flatten(trunk.forward_head(one_pixel, pre_logits=True), 1)
