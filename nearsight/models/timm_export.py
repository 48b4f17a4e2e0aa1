"""A timm model's pretrained features as a nearsight ONNX model: the zero-shot gallery's model.

``nearsight index build --model timm:NAME`` and ``nearsight.build_gallery(model="timm:NAME")``
call :func:`export_timm_model`: the trunk with its pretrained weights, the pooling its own
head uses (a ViT's class token, a CNN's average), no embedding head (``head: none``: the
pooled features, L2-normalised, are the embedding), its pretrained input size, statistics,
crop and interpolation; exported and parity-checked as any checkpoint is
(:func:`nearsight.models.export.export_onnx`). The file is kept in ``cache_dir`` under a name
that hashes everything that shapes it (model, weights file content, size, pooling, timm and
nearsight versions), so a second gallery from the same model reuses it instead of exporting
again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nearsight.core.digest import file_sha256
from nearsight.core.errors import NearsightError
from nearsight.models import timm_reuse
from nearsight.models.embedder import nearsight_version
from nearsight.models.spec import ModelSpec
from nearsight.models.trunks import trunk_family

if TYPE_CHECKING:  # timm_trunk imports torch: only an export that is not reused loads it
    from nearsight.models.timm_trunk import TimmInfo

ZERO_SHOT_PRETRAINED = ("auto", "hub", "none")  # or a weights file
# the folder beside a gallery where its zero-shot models are kept (galleries in one folder
# share them; the gallery records the model's path, so it must stay)
ZERO_SHOT_FOLDER = "nearsight-models"


def zero_shot_folder(gallery: str | os.PathLike[str]) -> Path:
    """Where the zero-shot model of the gallery ``gallery`` is exported: beside it."""
    return Path(os.path.abspath(gallery)).parent / ZERO_SHOT_FOLDER


@dataclass(frozen=True)
class TimmExport:
    path: Path  # the .onnx file
    spec: ModelSpec
    reused: bool  # found in the cache, not exported now
    weights: str  # where the weights came from: the hub file, FILE, or "random (none)"


def _weights(arch: str, pretrained: str) -> tuple[Path | None, str]:
    """(weights file or None for random weights, its description)."""
    from nearsight.models.timm_trunk import timm_info
    from nearsight.models.timm_weights import hub_weights_file

    if pretrained in ("auto", "hub"):  # a zero-shot gallery needs the weights: no fallback
        file = hub_weights_file(arch)
        return file, f"{timm_info(arch).hf_hub_id} ({file.name})"
    if pretrained == "none":
        return None, "random (--pretrained none)"
    file = Path(pretrained)
    if not file.is_file():
        raise NearsightError(
            f"--pretrained {pretrained}: neither auto, hub, none nor an existing weights file"
        )
    return file, str(file)


def _cache_name(info: TimmInfo, key: dict[str, object]) -> str:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return f"timm-{re.sub(r'[^A-Za-z0-9_.-]+', '_', info.name)}-{digest}.onnx"


def export_timm_model(
    arch: str,
    cache_dir: str | os.PathLike[str],
    *,
    pretrained: str = "auto",
    image_size: int | None = None,
    pooling: str | None = None,
    log: Callable[[str], None] | None = None,
) -> TimmExport:
    """The ONNX model of ``timm:NAME``'s pretrained features, exported into ``cache_dir`` (or
    found there). ``pretrained``: auto / hub (the Hugging Face cache, else a download, else a
    one-line error), none (random weights: for tests), or a weights file. ``image_size`` and
    ``pooling`` default to the pretrained model's own. An export recorded for the same
    request, whose inputs are unchanged, is reused without importing timm or torch
    (nearsight/models/timm_reuse.py)."""
    log = log or (lambda line: None)
    if not trunk_family(arch).exports_on_demand:
        raise NearsightError(f"a zero-shot model is timm:NAME, got {arch!r}")
    cache = Path(cache_dir)
    request = timm_reuse.request_key(arch, pretrained, image_size, pooling)
    recorded = timm_reuse.recorded_export(cache, request)
    if recorded is not None:
        path, recorded_spec, described = recorded
        log(f"reusing {path} ({arch} exported before)")
        return TimmExport(path, recorded_spec, True, described)

    import timm
    import torch

    from nearsight.models.checkpoint import save_checkpoint
    from nearsight.models.embedding import EmbeddingConfig, build_embedding_net
    from nearsight.models.export import export_onnx
    from nearsight.models.timm_trunk import timm_info

    info = timm_info(arch)
    size = int(image_size or info.image_size)
    pool = pooling or info.default_pooling
    config = EmbeddingConfig(
        arch=arch, head="none", pooling=pool, image_size=size, pretrained="none", freeze_bn=False
    )  # checks size, pooling before any weights are read
    weights, described = _weights(arch, pretrained)
    key = {
        "arch": arch,
        "weights": file_sha256(weights) if weights is not None else "random-seed-0",
        "image_size": size,
        "pooling": pool,
        "timm": timm.__version__,
        "nearsight": nearsight_version(),
    }
    out = cache / _cache_name(info, key)
    spec = config.spec()  # what the export writes into the model's metadata
    if out.is_file():
        log(f"reusing {out} (timm:{info.name} exported before)")
        timm_reuse.record_export(cache, request, out, weights, described, spec)
        return TimmExport(out, spec, True, described)
    cache.mkdir(parents=True, exist_ok=True)
    log(f"exporting timm:{info.name} ({described}, {size} px, {pool} pooling) to {out}")
    config.pretrained = "none" if weights is None else str(weights)
    torch.manual_seed(0)
    net = build_embedding_net(config)
    training = {"loss": "", "dataset": f"pretrained: {described}, not fine-tuned", "step": 0}
    with tempfile.TemporaryDirectory(prefix="nearsight-timm-", dir=cache) as work:
        checkpoint = save_checkpoint(
            Path(work) / "pretrained.pt", net, extra={"training": training}
        )
        export_onnx(checkpoint, out, log=log)
    timm_reuse.record_export(cache, request, out, weights, described, spec)
    return TimmExport(out, spec, False, described)
