"""The gallery-writing functions of ``import nearsight``. ``build_gallery`` calls the index
layer's builder (what ``nearsight index build`` calls); ``add_images`` and ``remove_items`` run
the CLI's own ``index add`` and ``index remove`` (the same parser, defaults and code). Errors are
NearsightError, one line."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nearsight.core.errors import NearsightError
from nearsight.index.gallery.defaults import DEFAULT_BATCH_SIZE, DEFAULT_CHUNK_SIZE
from nearsight.search.searcher import Searcher, open_gallery

PathLike = str | os.PathLike[str]


def _run(argv: Sequence[Any]) -> argparse.Namespace:
    """Parse ``argv`` as the CLI does and run it; argparse's complaint becomes one error."""
    from nearsight.app.cli import build_parser

    complaint = io.StringIO()
    try:
        with contextlib.redirect_stderr(complaint):
            args = build_parser().parse_args([os.fspath(a) if isinstance(a, os.PathLike)
                                              else str(a) for a in argv])  # fmt: skip
    except SystemExit:
        lines = [line for line in complaint.getvalue().splitlines() if line.strip()]
        raise NearsightError(
            lines[-1].split(": error: ", 1)[-1] if lines else "bad arguments"
        ) from None
    args.func(args)
    return args


def _option(name: str, value: Any) -> list[Any]:
    if value is None or value is False:
        return []
    if value is True:  # a switch
        return [name]
    if isinstance(value, list | tuple):
        return [name, *value]
    return [name, value]


def _flags(options: Mapping[str, Any]) -> list[Any]:
    """Keyword arguments as the command's flags: ``chunk_size=512`` -> ``--chunk-size 512``."""
    return [
        part
        for key, value in options.items()
        for part in _option(f"--{key.replace('_', '-')}", value)
    ]


def build_gallery(
    model: PathLike,
    out: PathLike,
    *,
    dataset: str | None = None,
    root: PathLike | None = None,
    images: Iterable[PathLike] | None = None,
    split: str = "auto",
    index_type: str = "auto",
    device: str = "auto",
    input_size: int | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    resize: int | None = None,
    output: str | None = None,
    pretrained: str = "auto",
    pooling: str | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    batch_size: int = DEFAULT_BATCH_SIZE,
    workers: int = 0,
    key_column: str | None = None,
    meta_types: Mapping[str, str] | None = None,
    max_index_memory: str | int | None = None,
    embeddings: str = "auto",
    neighbour_graph: bool = False,
) -> Searcher:
    """Embed a dataset (``dataset`` cub | cars | sop | folder | csv with its ``root`` and
    ``split``) or a list of ``images`` with ``model`` and write the gallery folder ``out``
    through :func:`nearsight.index.gallery.build.build_gallery` (what ``nearsight index build``
    runs); returns it opened for searching, its :class:`BuildReport` as ``.build_report``. A
    model exported elsewhere takes ``input_size``, ``mean``, ``std``, ``resize`` and
    ``output`` (``index build``'s flags of the same names). ``model="timm:NAME"``: a zero-shot
    gallery of a pretrained timm model, exported once into ``nearsight-models/`` beside ``out``
    (``pretrained``: auto | hub | none | FILE; ``input_size`` and ``pooling`` default to the
    model's own; needs the ``[train]`` extra)."""
    from nearsight.index.gallery.build import build_gallery as build
    from nearsight.index.gallery.keys import declared_meta_types
    from nearsight.index.gallery.sources import dataset_source, images_source
    from nearsight.models.embedder import load_embedder
    from nearsight.models.spec import is_timm

    if (dataset is None) == (images is None):
        raise NearsightError("build_gallery takes a dataset (with its root) or images, not both")
    if dataset is not None:
        if root is None:
            raise NearsightError("build_gallery: a dataset needs its root")
        declared = declared_meta_types(meta_types, key_column)
        source = dataset_source(dataset, root, split, declared)
    else:
        source = images_source(images or [])
    spec = None
    if is_timm(os.fspath(model)):
        if any(v is not None for v in (mean, std, resize, output)):
            raise NearsightError("mean, std, resize and output describe a model exported "
                                 "elsewhere, not timm:NAME")  # fmt: skip
        from nearsight.models.timm_export import export_timm_model, zero_shot_folder

        model = export_timm_model(os.fspath(model), zero_shot_folder(out), pretrained=pretrained,
                                  image_size=input_size, pooling=pooling).path  # fmt: skip
    elif pretrained != "auto" or pooling is not None:
        raise NearsightError("pretrained and pooling go with model='timm:NAME'")
    elif any(v is not None for v in (input_size, mean, std, resize, output)):
        from nearsight.models.foreign import foreign_spec

        spec = foreign_spec(model, image_size=input_size, mean=mean, std=std, resize=resize,
                            output=output)  # fmt: skip
    report = build(
        load_embedder(model, device=device, spec=spec),
        source,
        out,
        model_path=model,
        index_type=index_type,
        chunk_size=chunk_size,
        batch_size=batch_size,
        workers=workers,
        key_column=key_column,
        max_index_memory=max_index_memory,
        embeddings=embeddings,
        neighbour_graph=neighbour_graph,
    )
    gallery = open_gallery(out, device=device)
    gallery.build_report = report
    return gallery


def add_images(
    gallery: PathLike | Searcher,
    images: Iterable[PathLike],
    *,
    label: int | None = None,
    class_name: str | None = None,
    meta: Mapping[str, Any] | None = None,
    model: PathLike | None = None,
    device: str = "auto",
    **options: Any,
) -> list[int]:
    """Embed ``images`` (files) with the gallery's model and add them, as ``nearsight index
    add`` does; ``meta``: their extra columns ({"shop": "north", "price": 12.5}). Returns the
    new items' ids. Any other flag of the command is a keyword (``batch_size=16``). An open
    gallery passed here sees the change at once."""
    paths = list(images)
    if not paths:
        raise NearsightError("add_images: images is empty")
    argv: list[Any] = ["index", "add", "--gallery", _folder(gallery), *paths, "--device", device]
    argv += _option("--label", label) + _option("--class-name", class_name)
    argv += _option("--model", model)
    for key, value in (meta or {}).items():
        argv += ["--meta", f"{key}={value}"]
    argv += _flags(options)
    args = _run(argv)
    _reload(gallery)
    return list(args.added_ids)


def remove_items(
    gallery: PathLike | Searcher,
    ids: Iterable[int] | None = None,
    *,
    keys: Iterable[str] | None = None,
) -> None:
    """Remove the items ``ids`` (or those with the ``keys`` of the gallery's key column) from
    the gallery, as ``nearsight index remove`` does."""
    if (ids is None) == (keys is None):
        raise NearsightError("remove_items takes ids or keys, not both")
    wanted = [int(i) for i in ids] if ids is not None else [str(k) for k in keys or []]
    if not wanted:
        raise NearsightError(f"remove_items: {'ids' if ids is not None else 'keys'} is empty")
    which = "--ids" if ids is not None else "--keys"
    _run(["index", "remove", "--gallery", _folder(gallery), which, *wanted])
    _reload(gallery)


def _folder(gallery: PathLike | Searcher) -> Any:
    return gallery.path if isinstance(gallery, Searcher) else gallery


def _reload(gallery: PathLike | Searcher) -> None:
    if isinstance(gallery, Searcher):
        gallery.gallery.reload()
