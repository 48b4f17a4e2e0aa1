"""Checkpoint I/O: a checkpoint carries the network's spec, so it loads without training code.

File layout (torch.save, loadable with ``weights_only=True``)::

    {"format": "nearsight-checkpoint", "version": 2,
     "model_spec": ModelSpec.to_dict(), "model_training": {"pretrained": ..., "freeze_bn": ...},
     "state_dict": EmbeddingNet.state_dict(), **extra}

``model_spec`` (:mod:`nearsight.models.spec`) is the one description of the network, what
everyone who runs the model reads and what rebuilds it; ``model_training`` holds only what the
spec lacks (the weights training started from, whether BatchNorm was frozen). Version 1 files
stored the network a second time as ``model_config`` (:class:`EmbeddingConfig`); they still
load, and those from before ``model_spec`` existed get their spec from it.

``extra`` is where the trainer puts its state (optimiser, sampler, step, metrics...). It must
hold only plain Python types (dict, list, tuple, str, int, float, bool, None) and tensors, so
that the safe ``weights_only`` unpickler can read it back.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nearsight.core.atomic import atomic_write_path
from nearsight.core.errors import NearsightError
from nearsight.models.embedding import EmbeddingConfig, EmbeddingNet
from nearsight.models.spec import SPEC_KEY, ModelSpec

CHECKPOINT_FORMAT = "nearsight-checkpoint"
CHECKPOINT_VERSION = 2
TRAINING_KEY = "model_training"  # what the spec lacks: EmbeddingConfig's training fields
TRAINING_FIELDS = ("pretrained", "freeze_bn")
RESERVED_KEYS = ("format", "version", "model_config", "state_dict", SPEC_KEY, TRAINING_KEY)


def save_checkpoint(
    path: str | os.PathLike[str],
    model: EmbeddingNet | nn.Module,
    *,
    extra: Mapping[str, Any] | None = None,
    spec: ModelSpec | None = None,
) -> Path:
    """Write ``model`` (config + weights), its ``spec`` and ``extra`` to ``path`` atomically.
    ``spec`` defaults to the net's config with the test resize of the training config in
    ``extra["training"]["config"]["data"]["resize"]`` (the default ratio when absent). A DDP- or
    torch.compile-wrapped net is unwrapped first, so the keys are always the plain net's."""
    for wrapper_attribute in ("module", "_orig_mod"):  # DistributedDataParallel, torch.compile
        model = getattr(model, wrapper_attribute, model)
    if not isinstance(model, EmbeddingNet):
        raise TypeError(f"save_checkpoint wants an EmbeddingNet, got {type(model).__name__}")
    extra = dict(extra or {})
    clashes = [key for key in RESERVED_KEYS if key in extra]
    if clashes:
        raise ValueError(f"extra checkpoint keys clash with reserved ones: {clashes}")
    if spec is None:  # the training config's test resize, else the network's default
        training = extra.get("training") if isinstance(extra.get("training"), dict) else {}
        data = ((training.get("config") or {}).get("data") or {}) if training else {}
        spec = model.config.spec(data.get("resize") or None)
    if EmbeddingConfig.from_spec(spec, **_training_fields(model.config)) != model.config:
        raise ValueError("the spec given to save_checkpoint does not describe the network")
    payload = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        SPEC_KEY: spec.to_dict(),
        TRAINING_KEY: _training_fields(model.config),
        # CPU copies: a checkpoint written on a GPU machine loads anywhere
        "state_dict": {key: value.detach().cpu() for key, value in model.state_dict().items()},
        **extra,
    }
    final = Path(path)
    try:
        with atomic_write_path(final) as tmp:
            torch.save(payload, tmp)
    except RuntimeError as error:  # how torch's zip writer reports a failed write
        reason = " ".join(str(error).split())[:200]
        raise OSError(f"cannot write checkpoint {final} (a full disk?): {reason}") from None
    return final


def load_checkpoint(
    path: str | os.PathLike[str], map_location: str | torch.device = "cpu"
) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`; NearsightError if it is missing,
    not a nearsight checkpoint, from a newer version, or damaged."""
    file = Path(path)
    if not file.is_file():
        raise NearsightError(f"checkpoint not found: {file}")
    try:
        payload = torch.load(file, map_location=map_location, weights_only=True)
    except Exception as error:  # truncated zip, garbage, disallowed pickled objects
        reason = " ".join(str(error).split())[:160]
        raise NearsightError(f"{file}: not a readable nearsight checkpoint ({reason})") from None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise NearsightError(f"{file}: not a nearsight checkpoint (no '{CHECKPOINT_FORMAT}' tag)")
    version = payload.get("version")
    if not isinstance(version, int) or version > CHECKPOINT_VERSION:
        raise NearsightError(
            f"{file}: checkpoint version {version!r} is newer than this nearsight reads "
            f"({CHECKPOINT_VERSION})"
        )
    described = isinstance(payload.get(SPEC_KEY), dict) or isinstance(
        payload.get("model_config"), dict
    )
    if not described or not isinstance(payload.get("state_dict"), dict):
        raise NearsightError(f"{file}: checkpoint lacks its model_spec or state_dict")
    return payload


def checkpoint_config(payload: Mapping[str, Any]) -> EmbeddingConfig:
    """The network's config from a checkpoint: its spec and training fields (version 2), or
    the ``model_config`` a version 1 file stored."""
    if "model_config" in payload:  # version 1
        return EmbeddingConfig.from_dict(payload["model_config"])
    training = payload.get(TRAINING_KEY) or {}
    if not isinstance(training, Mapping) or set(training) - set(TRAINING_FIELDS):
        raise NearsightError(f"{TRAINING_KEY} must map {', '.join(TRAINING_FIELDS)} to values")
    return EmbeddingConfig.from_spec(ModelSpec.from_dict(payload[SPEC_KEY]), **training)


def _training_fields(config: EmbeddingConfig) -> dict[str, Any]:
    return {name: getattr(config, name) for name in TRAINING_FIELDS}


def load_embedding_net(
    path: str | os.PathLike[str], map_location: str | torch.device = "cpu"
) -> EmbeddingNet:
    """The network stored in a checkpoint, in eval mode. Built from the stored config without
    fetching pretrained weights (the stored weights replace them); ``config.pretrained`` keeps
    the value recorded at training time."""
    payload = load_checkpoint(path, map_location=map_location)
    try:
        config = checkpoint_config(payload)
    except (NearsightError, TypeError) as error:
        raise NearsightError(f"{path}: bad model description: {error}") from None
    net = EmbeddingNet(config)
    try:
        net.load_state_dict(payload["state_dict"], strict=True)
    except RuntimeError as error:  # missing/unexpected keys, wrong shapes
        reason = " ".join(str(error).split())
        reason = reason if len(reason) <= 240 else reason[:237] + "..."
        raise NearsightError(f"{path}: weights do not match the stored config ({reason})") from None
    net.to(map_location)
    return net.eval()


def checkpoint_sha256(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of the checkpoint file (recorded in the ONNX metadata and galleries)."""
    file = Path(path)
    if not file.is_file():
        raise NearsightError(f"checkpoint not found: {file}")
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
