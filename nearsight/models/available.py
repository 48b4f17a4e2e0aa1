"""What can embed images on this machine, found without a network and without torch (the
``nearsight models`` list):

- pretrained timm models whose weights the Hugging Face hub cache holds (the ``timm/NAME``
  repositories huggingface_hub writes: ``models--timm--NAME/snapshots/REV/FILE``), usable as
  ``--model timm:NAME``;
- weights files in torch.hub's checkpoints folder (``TORCH_HOME/hub/checkpoints``): torchvision's
  ImageNet ResNets (``nearsight train --pretrained imagenet``) and others (``--pretrained FILE``);
- ONNX files given by path: a nearsight export (its dim and image size from its metadata) or a
  model exported elsewhere (its input and output as the graph declares them);
(the models galleries record are listed by the command, nearsight/app/commands/models.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from nearsight.models.embedder import MODEL_FORMAT
from nearsight.models.spec import spec_from_onnx_metadata

HUB_WEIGHTS = ("model.safetensors", "pytorch_model.bin", "open_clip_model.safetensors",
               "open_clip_pytorch_model.bin")  # fmt: skip
TORCHVISION_RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")
MAX_ONNX_FILES = 200  # a folder given by path: the first ONNX files found, by name


@dataclass(frozen=True)
class Available:
    """One model that can embed here: its ``kind`` (timm, torch-hub, onnx, gallery), the
    ``name`` to give (``--model``/``--pretrained`` value), what it is, how to use it, and
    whether it is usable (a file that is missing or unreadable is listed, and says why)."""

    kind: str
    name: str
    detail: str
    use: str
    usable: bool = True
    facts: dict[str, object] = field(default_factory=dict)


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache folder (as huggingface_hub reads its environment)."""
    env = os.environ
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(name):
            return Path(env[name]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return (base / "huggingface" / "hub").expanduser()


def torch_hub_dir() -> Path:
    """torch.hub's folder (``torch.hub.get_dir()``'s rule: TORCH_HOME, else the cache's
    ``torch``), read without importing torch."""
    env = os.environ
    if env.get("TORCH_HOME"):
        return Path(env["TORCH_HOME"]).expanduser() / "hub"
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return (base / "torch" / "hub").expanduser()


def cached_timm() -> list[Available]:
    """The timm models whose weights the hub cache holds, by name."""
    cache = hub_cache_dir()
    found = []
    for repo in sorted(cache.glob("models--timm--*")):
        name = repo.name.removeprefix("models--timm--")
        files = [path for path in repo.glob("snapshots/*/*") if path.name in HUB_WEIGHTS]
        if not any(path.is_file() for path in files):  # a dangling link: a partial download
            continue
        found.append(Available(
            "timm", f"timm:{name}", f"pretrained timm weights in {cache}",
            f"nearsight index build --model timm:{name} ... (needs nearsight[train])",
        ))  # fmt: skip
    return found


def cached_torch_weights() -> list[Available]:
    """The weights files in torch.hub's checkpoints folder."""
    folder = torch_hub_dir() / "checkpoints"
    found = []
    for path in sorted(folder.glob("*")):
        if path.suffix not in (".pth", ".pt", ".bin", ".safetensors") or not path.is_file():
            continue
        arch = path.name.split("-")[0]
        if arch in TORCHVISION_RESNETS:
            found.append(Available(
                "torch-hub", arch, f"torchvision's ImageNet {arch} ({path.name})",
                f"nearsight train --set model.arch={arch} --pretrained imagenet ...",
            ))  # fmt: skip
        else:
            found.append(Available(
                "torch-hub", str(path), "a weights file in torch.hub's cache",
                f"nearsight train ... --pretrained {path}",
            ))  # fmt: skip
    return found


def onnx_files(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The ONNX files of ``paths``: files as given, folders searched (by name, at most
    :data:`MAX_ONNX_FILES` each)."""
    files: list[Path] = []
    for given in paths:
        path = Path(given).expanduser()
        if path.is_dir():
            files += sorted(path.rglob("*.onnx"))[:MAX_ONNX_FILES]
        else:
            files.append(path)
    return files


def describe_onnx(path: Path) -> Available:
    """What the ONNX file ``path`` is: a nearsight export, a model exported elsewhere, or a
    file that cannot be read as a model."""
    import onnxruntime as ort

    if not path.is_file():
        return Available("onnx", str(path), "no such file", "-", usable=False)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime's own errors: a damaged or foreign file
        reason = " ".join(str(error).split())[:160]
        return Available("onnx", str(path), f"not a readable ONNX model ({reason})", "-",
                         usable=False)  # fmt: skip
    metadata = dict(session.get_modelmeta().custom_metadata_map)
    if metadata.get("format") == MODEL_FORMAT:
        try:
            spec = spec_from_onnx_metadata(metadata)
        except Exception as error:  # bad metadata: say so, as the loader would
            return Available("onnx", str(path), f"a nearsight model with bad metadata ({error})",
                             "-", usable=False)  # fmt: skip
        detail = f"nearsight model: dim {spec.output_dim}, {spec.image_size} px, {spec.arch}"
        facts = {"dim": spec.output_dim, "image_size": spec.image_size, "arch": spec.arch}
        return Available("onnx", str(path), detail, f"nearsight index build --model {path} ...",
                         facts=facts)  # fmt: skip
    inputs = ", ".join(f"{i.name} {list(i.shape)}" for i in session.get_inputs())
    outputs = ", ".join(f"{o.name} {list(o.shape)}" for o in session.get_outputs())
    return Available(
        "onnx", str(path), f"exported elsewhere: inputs {inputs}; outputs {outputs}",
        f"nearsight index build --model {path} --input-size N --mean ... --std ... "
        "(docs/galleries.md)",
    )  # fmt: skip


HOW_TO_GET_ONE = (
    "no model here: take a pretrained timm model (on a connected machine `hf download "
    "timm/resnet50.a1_in1k`, then copy its cache folder here; see docs/backbones.md), give your "
    "own ONNX file (`nearsight models FILE.onnx`), or train one (`nearsight train ...`, then "
    "`nearsight export`; docs/training.md)"
)
