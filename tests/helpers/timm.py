"""timm trunks: tiny random models and a Hugging Face hub cache made on disk."""

from __future__ import annotations

import os
from pathlib import Path

TIMM_VIT, TIMM_CONVNEXT, TIMM_RESNET = "timm:test_vit", "timm:test_convnext", "timm:test_resnet"


def write_hub_weights(
    cache: Path, repo_id: str, state_dict: dict, revision: str = "0" * 40
) -> Path:
    """``state_dict`` saved as the hub's ``model.safetensors`` of ``repo_id`` in ``cache``, in
    the layout huggingface_hub writes: the file in ``blobs/``, linked from
    ``snapshots/REVISION/``, and ``refs/main`` naming the revision. Returns the snapshot path."""
    import hashlib

    from safetensors.torch import save_file

    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    staged = repo / "blobs" / "staged"
    save_file({key: value.contiguous() for key, value in state_dict.items()}, str(staged))
    blob = repo / "blobs" / hashlib.sha256(staged.read_bytes()).hexdigest()
    staged.rename(blob)
    snapshot = repo / "snapshots" / revision / "model.safetensors"
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    snapshot.symlink_to(os.path.relpath(blob, snapshot.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot
