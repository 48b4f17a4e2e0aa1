"""From a ``--model`` value to an :class:`~nearsight.models.embedder.Embedder`, in one place for
the CLI, ``import nearsight`` and ``serve``: :func:`load_embedder` runs a model file by its
suffix; :func:`resolve_embedder` also takes ``timm:NAME`` (exported once into a folder, then
run from its ONNX file) and a model exported elsewhere (run as its options describe)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nearsight.core.errors import NearsightError
from nearsight.models.embedder import Embedder, OnnxEmbedder
from nearsight.models.foreign import ForeignOnnxEmbedder, foreign_spec
from nearsight.models.onnx_session import default_providers
from nearsight.models.spec import ModelSpec
from nearsight.models.trunks import trunk_family


def load_embedder(
    path: str | os.PathLike[str],
    device: str = "auto",
    *,
    optimization: str = "all",
    spec: ModelSpec | None = None,
) -> Embedder:
    """The embedder for a model file, by suffix: ``.onnx`` (onnxruntime) or ``.pt``/``.pth``
    (a torch checkpoint). ``device``: auto | cpu | cuda. ``optimization``: see
    :class:`OnnxEmbedder` (ONNX only). ``spec``: a foreign model's spec
    (:func:`nearsight.models.foreign.foreign_spec`, or the one a gallery recorded): an ONNX model
    exported elsewhere, run as it describes."""
    file = Path(path)
    if not file.is_file():
        raise NearsightError(f"model not found: {file}")
    suffix = file.suffix.lower()
    if spec is not None and spec.foreign and suffix != ".onnx":
        raise NearsightError(f"{file}: a model exported elsewhere must be a .onnx file")
    if suffix == ".onnx":
        providers = default_providers(device)
        if spec is not None and spec.foreign:
            embedder: OnnxEmbedder = ForeignOnnxEmbedder(
                file, spec, providers=providers, optimization=optimization
            )
        else:
            embedder = OnnxEmbedder(file, providers=providers, optimization=optimization)
        if device == "cuda" and embedder.device != "cuda":
            raise NearsightError(
                "--device cuda: onnxruntime could not start its CUDA provider here "
                "(see onnxruntime's CUDA requirements); use --device auto or cpu"
            )
        return embedder
    if suffix in (".pt", ".pth"):
        from nearsight.models.torch_embedder import TorchEmbedder

        return TorchEmbedder(file, device=device)
    raise NearsightError(
        f"{file} is not a nearsight model: expected a .onnx file (from `nearsight export`) "
        "or a .pt checkpoint"
    )


def option_name(name: str) -> str:
    """How the Python API names an option in its errors (the CLI passes ``--flag-names``)."""
    return name


@dataclass(frozen=True)
class ModelRequest:
    """What a caller asked for as its model: a nearsight model file, ``timm:NAME`` with its
    export options, or an ONNX model exported elsewhere with its input description."""

    model: str | os.PathLike[str]
    pretrained: str = "auto"  # timm:NAME only: auto | hub | none | FILE
    pooling: str | None = None  # timm:NAME only
    input_size: int | None = None  # timm:NAME, or a model exported elsewhere
    mean: Sequence[float] | None = None  # the rest: a model exported elsewhere only
    std: Sequence[float] | None = None
    resize: int | None = None
    output: str | None = None
    model_spec: str | os.PathLike[str] | None = None  # the file the options above came from

    def foreign_options(self) -> dict[str, Any]:
        """The options that describe a model exported elsewhere, those given."""
        names = ("mean", "std", "resize", "output")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}


def resolve_embedder(
    request: ModelRequest,
    *,
    gallery: str | os.PathLike[str],
    device: str = "auto",
    log: Callable[[str], None] | None = None,
    name: Callable[[str], str] = option_name,
) -> Embedder:
    """The embedder of ``request`` for the gallery folder ``gallery``: a ``timm:NAME`` model is
    exported beside that gallery (or found there) and run from its ONNX file (the embedder's
    ``.path``, which the gallery records); a model exported elsewhere is run as its options
    describe. ``name`` spells an
    option in the one-line errors (``--pretrained`` on the command line)."""
    model = os.fspath(request.model)
    family = trunk_family(model)
    if not family.exports_on_demand:
        if request.pretrained != "auto" or request.pooling is not None:
            raise NearsightError(
                f"{name('pretrained')} and {name('pooling')} go with {name('model')} timm:NAME"
            )
        spec: ModelSpec | None = None
        if request.foreign_options() or request.input_size is not None:
            spec = foreign_spec(model, image_size=request.input_size, **request.foreign_options())
        return load_embedder(model, device=device, spec=spec)
    given = [name(option) for option in request.foreign_options()]
    given += [name("model_spec")] if request.model_spec else []
    if given:
        raise NearsightError(f"{', '.join(given)}: for a model exported elsewhere, not timm:NAME")
    from nearsight.models.timm_export import export_timm_model, zero_shot_folder

    exported = export_timm_model(
        model,
        zero_shot_folder(gallery),
        pretrained=request.pretrained,
        image_size=request.input_size,
        pooling=request.pooling,
        log=log,
    )
    return load_embedder(exported.path, device=device)
