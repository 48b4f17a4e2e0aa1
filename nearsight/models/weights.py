"""Pretrained trunk weights: resolve ``--pretrained`` to a state_dict and load it strictly.

``pretrained`` is one of

- ``"none"``: random initialisation (torchvision's);
- ``"imagenet"`` / ``"imagenet-v1"``: torchvision's ``IMAGENET1K_V1`` weights, the ones the
  papers fine-tune from; ``"imagenet-v2"``: torchvision's ``IMAGENET1K_V2`` (better ImageNet
  accuracy, not what the papers used);
- a path to a ``.pth`` file: a plain state_dict, or a dict holding one under ``"state_dict"``
  or ``"model"`` (``"module."`` prefixes of DataParallel/DDP are stripped; a nearsight
  checkpoint works too: its ``"trunk."`` keys are taken).

ImageNet weights are read from torch.hub's cache (``torch.hub.get_dir()/checkpoints/``, where
torchvision itself puts them). When they are not cached the download is attempted only after a
connection check that fails within seconds, so an offline machine gets a one-line
:class:`NearsightError` naming the ways out instead of a long hang.
"""

from __future__ import annotations

import os
import socket
import threading
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from nearsight.core.errors import NearsightError

IMAGENET_CHOICES: dict[str, str] = {
    "imagenet": "IMAGENET1K_V1",
    "imagenet-v1": "IMAGENET1K_V1",
    "imagenet-v2": "IMAGENET1K_V2",
}
# seconds allowed for the DNS lookup and the TCP connect that precede a download
CONNECT_TIMEOUT_S = 3.0
# seconds a stalled download may wait for data before it fails
DOWNLOAD_TIMEOUT_S = 30.0


def is_imagenet(pretrained: str) -> bool:
    return pretrained in IMAGENET_CHOICES


def imagenet_weights(arch: str, pretrained: str):
    """The torchvision weights enum member for ``arch`` and ``pretrained`` ("imagenet-v2"...)."""
    from torchvision.models import get_model_weights

    weights_enum = get_model_weights(arch)
    member = IMAGENET_CHOICES[pretrained]
    if member not in weights_enum.__members__:
        raise NearsightError(
            f"--pretrained {pretrained}: torchvision has no {member} weights for {arch}"
        )
    return weights_enum[member]


def imagenet_cache_path(arch: str, pretrained: str) -> Path:
    """Where torch.hub (and so torchvision) keeps the downloaded file for these weights."""
    weights = imagenet_weights(arch, pretrained)
    file_name = os.path.basename(urllib.parse.urlparse(weights.url).path)
    return Path(torch.hub.get_dir()) / "checkpoints" / file_name


def resolve_pretrained(pretrained: str, arch: str = "resnet50") -> dict[str, torch.Tensor] | None:
    """The trunk state_dict (torchvision key names, ``fc.*`` possibly included) for
    ``pretrained``, or None for ``"none"``. Raises NearsightError when it cannot be had."""
    if pretrained == "none":
        return None
    if is_imagenet(pretrained):
        return _imagenet_state_dict(arch, pretrained)
    return read_state_dict_file(pretrained)


def _imagenet_state_dict(arch: str, pretrained: str) -> dict[str, torch.Tensor]:
    weights = imagenet_weights(arch, pretrained)
    cached = imagenet_cache_path(arch, pretrained)
    member = IMAGENET_CHOICES[pretrained]
    way_out = (
        f"ImageNet weights for {arch} ({member}) are not cached at {cached} and cannot be "
        f"downloaded: use --pretrained none, or --pretrained FILE.pth with a local copy"
    )
    if not cached.is_file():
        reason = connection_problem(weights.url)
        if reason is not None:
            raise NearsightError(f"{way_out} ({reason})")
        try:
            _download(weights.url, cached)
        except (OSError, RuntimeError) as error:
            raise NearsightError(f"{way_out} ({one_line(error)})") from None
    return _torch_load(cached, what=f"cached ImageNet weights for {arch} ({member})")


def connection_problem(url: str) -> str | None:
    """None when a TCP connection to the host that serves ``url`` (or to the HTTPS proxy, if
    one is configured) opens within CONNECT_TIMEOUT_S; otherwise a short reason."""
    proxy = urllib.request.getproxies().get(urllib.parse.urlparse(url).scheme)
    target = urllib.parse.urlparse(proxy if proxy else url)
    host = target.hostname
    if not host:
        return f"no host in {url}"
    port = target.port or (443 if target.scheme == "https" else 80)

    # getaddrinfo has no timeout of its own: run it on a daemon thread and stop waiting.
    outcome: dict[str, object] = {}

    def lookup() -> None:
        try:
            outcome["addresses"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as error:
            outcome["error"] = error

    thread = threading.Thread(target=lookup, daemon=True)
    thread.start()
    thread.join(CONNECT_TIMEOUT_S)
    if thread.is_alive():
        return f"no answer resolving {host} within {CONNECT_TIMEOUT_S:g} s"
    if "error" in outcome:
        return f"cannot resolve {host}: {one_line(outcome['error'])}"
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as error:
        return f"cannot connect to {host}:{port}: {one_line(error)}"
    return None


def _download(url: str, destination: Path) -> None:
    """Download with torch.hub (hash-checked, written to a temp file and renamed) under a
    socket timeout so that a stalled transfer fails instead of hanging."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)
    try:
        match = torch.hub.HASH_REGEX.search(destination.name)  # torchvision names carry a hash
        hash_prefix = match.group(1) if match else None
        torch.hub.download_url_to_file(url, str(destination), hash_prefix, progress=True)
    finally:
        socket.setdefaulttimeout(previous)


def read_state_dict_file(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Read a local weights file: a state_dict, or a dict with one under "state_dict"/"model"."""
    file = Path(path)
    if not file.is_file():
        choices = "|".join([*IMAGENET_CHOICES, "none"])
        raise NearsightError(f"--pretrained {path}: neither {choices} nor an existing weights file")
    loaded = _torch_load(file, what="weights file")
    state = loaded
    if isinstance(loaded, Mapping):
        for key in ("state_dict", "model"):
            if isinstance(loaded.get(key), Mapping):
                state = loaded[key]
                break
    if not isinstance(state, Mapping) or not all(
        isinstance(value, torch.Tensor) for value in state.values()
    ):
        raise NearsightError(
            f"{file}: not a state_dict of tensors (nor one under 'state_dict'/'model')"
        )
    state = {_strip_prefix(key, "module."): value for key, value in state.items()}
    # a nearsight checkpoint (or any model that wraps the trunk as `trunk`): take its trunk
    if any(key.startswith("trunk.") for key in state):
        state = {
            key[len("trunk.") :]: value for key, value in state.items() if key.startswith("trunk.")
        }
    return state


def _torch_load(path: Path, *, what: str):
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # truncated zip, pickle garbage, disallowed globals...
        raise NearsightError(f"{path}: cannot read {what} ({one_line(error)})") from None


def load_trunk_weights(
    trunk: nn.Module, state_dict: Mapping[str, torch.Tensor], *, source: str
) -> None:
    """Load ``state_dict`` into ``trunk`` strictly: every trunk key must be present with the
    right shape and nothing else may be there, except the classifier ``fc.*`` (ignored) and
    BatchNorm ``num_batches_tracked`` counters (old torchvision files lack them)."""
    expected = trunk.state_dict()
    given = {key: value for key, value in state_dict.items() if not key.startswith("fc.")}
    for key, value in expected.items():
        if key.endswith("num_batches_tracked") and key not in given:
            given[key] = value.clone()
    missing = [key for key in expected if key not in given]
    unexpected = [key for key in given if key not in expected]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (first: {missing[0]})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (first: {unexpected[0]})")
        raise NearsightError(f"{source}: keys do not match the trunk: {', '.join(parts)}")
    for key, value in expected.items():
        if tuple(given[key].shape) != tuple(value.shape):
            raise NearsightError(
                f"{source}: {key} has shape {tuple(given[key].shape)}, the trunk expects "
                f"{tuple(value.shape)}"
            )
    trunk.load_state_dict(given, strict=True)


def _strip_prefix(key: str, prefix: str) -> str:
    while key.startswith(prefix):
        key = key[len(prefix) :]
    return key


def one_line(error: object) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= 200 else text[:197] + "..."
