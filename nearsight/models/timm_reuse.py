"""Reusing a timm model's ONNX export without importing timm or torch.

The export's file name hashes what shapes it (nearsight/models/timm_export.py), and working
that out needs timm, which imports torch (1.9 GB resident, against 0.5 GB for the rest of a
build). So each export is also recorded in ``exports.json`` beside it, under the request as
given (model, ``--pretrained``, size, pooling), with what the hash depended on that can be
checked without torch: the timm and nearsight versions, and the weights file's size and
modification time (for weights in the Hugging Face cache, also the cache's refs, which decide
which snapshot a name resolves to). A request whose record still holds reuses the file at
once; anything else (no record, a changed file, a new version) goes the long way."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any

from nearsight.core.atomic import atomic_file
from nearsight.models.embedder import nearsight_version
from nearsight.models.spec import ModelSpec

RECORDS = "exports.json"


def request_key(arch: str, pretrained: str, image_size: int | None, pooling: str | None) -> str:
    """The request as given, as one string."""
    request = {"arch": arch, "pretrained": pretrained, "image_size": image_size,
               "pooling": pooling}  # fmt: skip
    return json.dumps(request, sort_keys=True)


def weights_state(path: Path | None) -> dict[str, Any] | None:
    """What identifies a weights file without reading it: its path, size and mtime, and for a
    file of the Hugging Face cache the contents of its repo's refs."""
    if path is None:
        return None
    stat = path.stat()
    state: dict[str, Any] = {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    parts = path.parts
    if "snapshots" in parts:
        refs = Path(*parts[: parts.index("snapshots")]) / "refs"
        state["refs"] = {
            str(ref.relative_to(refs)): ref.read_text().strip()
            for ref in sorted(refs.rglob("*"))
            if ref.is_file()
        }
    return state


def _versions() -> dict[str, str]:
    try:
        timm = metadata.version("timm")
    except metadata.PackageNotFoundError:
        timm = ""
    return {"timm": timm, "nearsight": nearsight_version()}


def _read(cache: Path) -> dict[str, Any]:
    try:
        records = json.loads((cache / RECORDS).read_text())
    except (OSError, ValueError):
        return {}
    return records if isinstance(records, dict) else {}


def recorded_export(cache: Path, request: str) -> tuple[Path, ModelSpec, str] | None:
    """(the ONNX file, its spec, where its weights came from) of an earlier export of the
    same request, when everything it depended on is unchanged; else None."""
    record = _read(cache).get(request)
    if not isinstance(record, dict) or record.get("versions") != _versions():
        return None
    onnx = cache / str(record.get("onnx", ""))
    if not onnx.is_file():
        return None
    recorded = record.get("weights")
    try:
        now = weights_state(Path(recorded["path"])) if recorded else None
    except (OSError, KeyError, TypeError, ValueError):
        return None
    if now != recorded:
        return None
    try:
        spec = ModelSpec.from_dict(record["spec"])
    except (KeyError, TypeError, ValueError):
        return None
    return onnx, spec, str(record.get("described", ""))


def record_export(
    cache: Path, request: str, onnx: Path, weights: Path | None, described: str, spec: ModelSpec
) -> None:
    """Remember an export for :func:`recorded_export` (best effort: a read-only cache folder
    only means the next request goes the long way)."""
    records = _read(cache)
    records[request] = {
        "onnx": onnx.name,
        "weights": weights_state(weights),
        "versions": _versions(),
        "described": described,
        "spec": spec.to_dict(),
    }
    try:
        with atomic_file(cache / RECORDS, "w") as handle:
            handle.write(json.dumps(records, indent=1, sort_keys=True))
    except OSError:
        pass
