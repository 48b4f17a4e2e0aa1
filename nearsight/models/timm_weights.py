"""Pretrained weights of timm trunks, offline first: ``--pretrained hub|none|FILE`` for ``timm:NAME``.

- ``hub``: timm's weights for the model, from the Hugging Face hub cache (the layout
  huggingface_hub writes: ``models--ORG--REPO/snapshots/REV/FILE`` with ``refs/REV``), found
  with ``try_to_load_from_cache`` and so read without any network; when they are not cached,
  downloaded, but only after a connection check that fails within seconds
  (:func:`nearsight.models.weights.connection_problem`) and with the hub's own timeouts. With
  ``HF_HUB_OFFLINE`` set, or no connection, one line names the model, the cache folder and the
  command that fetches the weights on a connected machine.
- ``FILE``: a ``.safetensors`` file, or a torch state_dict file (``.pth``, ``.bin``; also a
  nearsight checkpoint, whose ``trunk.`` keys are taken), in timm's key names.
- ``auto`` (training configs): ``hub`` when the cache holds the weights, else ``none``.

The cache folder is read from the environment at call time, as huggingface_hub reads it at
import time: ``HF_HUB_CACHE``, else ``HUGGINGFACE_HUB_CACHE``, else ``HF_HOME/hub``, else
``XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from nearsight.core.errors import NearsightError
from nearsight.models.available import hub_cache_dir
from nearsight.models.timm_trunk import TimmInfo, timm_info
from nearsight.models.weights import connection_problem, one_line, read_state_dict_file

HUB = "hub"
# the hub's default file names, safetensors first (what timm's loader tries, in its order)
DEFAULT_FILES = ("model.safetensors", "pytorch_model.bin")
HUB_TIMEOUT_S = 10.0  # huggingface_hub's metadata and download timeouts, seconds


def hub_endpoint() -> str:
    """The hub's address (``HF_ENDPOINT``, read now; huggingface_hub's default otherwise)."""
    from huggingface_hub import constants

    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or constants.ENDPOINT


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def _repo(info: TimmInfo) -> tuple[str, str | None]:
    """(repo id, revision) of the model's weights on the hub."""
    if not info.hf_hub_id:
        raise NearsightError(
            f"--pretrained hub: timm has no Hugging Face weights for timm:{info.name}; use "
            "--pretrained none or FILE"
        )
    repo, _, revision = info.hf_hub_id.partition("@")
    return repo, revision or None


def _file_names(info: TimmInfo) -> tuple[str, ...]:
    name = info.hf_hub_filename
    if not name:
        return DEFAULT_FILES
    if name.endswith(".bin"):  # the safetensors twin first, as timm's loader looks
        twin = "open_clip_model.safetensors" if name == "open_clip_pytorch_model.bin" else None
        return tuple(n for n in (twin, name[:-4] + ".safetensors", name) if n)
    return (name,)


def hub_cached_file(arch: str) -> Path | None:
    """The cached weights file of ``timm:NAME``, or None when the cache lacks it."""
    from huggingface_hub import try_to_load_from_cache

    info = timm_info(arch)
    if not info.hf_hub_id:
        return None
    repo, revision = _repo(info)
    for name in _file_names(info):
        found = try_to_load_from_cache(
            repo, name, cache_dir=str(hub_cache_dir()), revision=revision
        )
        if isinstance(found, str) and Path(found).is_file():
            return Path(found)
    return None


def hub_weights_file(arch: str) -> Path:
    """The weights file of ``timm:NAME``: from the cache, or downloaded into it; a one-line
    NearsightError when neither can be had (within seconds, never a hang)."""
    cached = hub_cached_file(arch)
    if cached is not None:
        return cached
    info = timm_info(arch)
    repo, revision = _repo(info)
    cache = hub_cache_dir()
    first = _file_names(info)[0]
    way_out = (
        f"timm:{info.name}: its pretrained weights ({repo}, {first}) are not in the Hugging Face "
        f"cache {cache} and cannot be downloaded here"
    )
    fetch = (
        f"on a connected machine run `hf download {repo} {first}`, then copy the "
        f"models--{repo.replace('/', '--')} folder of its cache (~/.cache/huggingface/hub by "
        f"default) into {cache} (or point HF_HUB_CACHE at a copy); or use --pretrained none | FILE"
    )
    if hub_offline():
        raise NearsightError(f"{way_out} (HF_HUB_OFFLINE is set); {fetch}")
    endpoint = hub_endpoint()
    reason = connection_problem(endpoint)
    if reason is not None:
        raise NearsightError(f"{way_out} ({reason}); {fetch}")
    return _download(info, repo, revision, cache, endpoint, way_out, fetch)


def _download(
    info: TimmInfo,
    repo: str,
    revision: str | None,
    cache: Path,
    endpoint: str,
    way_out: str,
    fetch: str,
) -> Path:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import EntryNotFoundError

    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", str(int(HUB_TIMEOUT_S)))
    last = "no weights file on the hub"
    for name in _file_names(info):
        try:
            path = hf_hub_download(
                repo,
                name,
                revision=revision,
                cache_dir=str(cache),
                endpoint=endpoint,
                etag_timeout=HUB_TIMEOUT_S,
            )
            return Path(path)
        except EntryNotFoundError:
            continue
        except Exception as error:  # HTTP errors, timeouts, gated repos, a full disk
            last = one_line(error)
            break
    raise NearsightError(f"{way_out} ({last}); {fetch}")


def read_weights_file(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """A local weights file: ``.safetensors``, or a torch state_dict (see
    :func:`nearsight.models.weights.read_state_dict_file`)."""
    file = Path(path)
    if file.suffix.lower() != ".safetensors":
        return read_state_dict_file(file)
    if not file.is_file():
        raise NearsightError(f"--pretrained {path}: no such weights file")
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(file), device="cpu")
    except (SafetensorError, OSError, ValueError) as error:
        raise NearsightError(
            f"{file}: cannot read safetensors weights ({one_line(error)})"
        ) from None


def timm_pretrained_state(arch: str, pretrained: str) -> tuple[dict[str, torch.Tensor] | None, str]:
    """(state_dict or None for ``none``, where it came from) for a timm trunk."""
    if pretrained == "none":
        return None, ""
    if pretrained == HUB:
        file = hub_weights_file(arch)
        return read_weights_file(file), f"--pretrained hub ({file})"
    if not Path(pretrained).is_file():
        raise NearsightError(
            f"--pretrained {pretrained}: neither hub, none nor an existing weights file "
            f"(timm:{timm_info(arch).name})"
        )
    return read_weights_file(pretrained), f"--pretrained {pretrained}"
