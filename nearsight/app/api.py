"""The gallery functions of ``import nearsight``: typed wrappers over the index layer's jobs,
which the CLI's commands run too. ``build_gallery`` calls its builder (``nearsight index
build``), ``add_images`` and ``remove_items`` its typed add and remove
(nearsight.index.gallery.update: ``index add``, ``index remove``), ``get_item`` reads one item
by id or key (``index show``). Errors are NearsightError, one line."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nearsight.core.errors import NearsightError
from nearsight.index.gallery.defaults import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_CHUNK_SIZE,
    DEFAULT_WORKERS,
)
from nearsight.search.searcher import Searcher, open_gallery

PathLike = str | os.PathLike[str]


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
    from nearsight.models.loading import ModelRequest, resolve_embedder

    if (dataset is None) == (images is None):
        raise NearsightError("build_gallery takes a dataset (with its root) or images, not both")
    if dataset is not None:
        if root is None:
            raise NearsightError("build_gallery: a dataset needs its root")
        declared = declared_meta_types(meta_types, key_column)
        source = dataset_source(dataset, root, split, declared)
    else:
        source = images_source(images or [])
    embedder = resolve_embedder(
        ModelRequest(model, pretrained=pretrained, pooling=pooling, input_size=input_size,
                     mean=mean, std=std, resize=resize, output=output),
        gallery=out,
        device=device,
    )  # fmt: skip
    report = build(
        embedder,
        source,
        out,
        model_path=embedder.path,
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
    label: int | str | None = None,
    class_name: str | None = None,
    meta: Mapping[str, Any] | None = None,
    key: str | None = None,
    meta_types: Mapping[str, str] | None = None,
    model: PathLike | None = None,
    device: str = "auto",
    batch_size: int = DEFAULT_BATCH_SIZE,
    workers: int = DEFAULT_WORKERS,
) -> list[int]:
    """Embed ``images`` (files) with the gallery's model and add them through
    :func:`nearsight.index.gallery.update.add_images` (what ``nearsight index add`` runs).
    ``label``: an integer label or a class name; ``meta``: their extra columns ({"shop":
    "north", "price": 12.5}); ``key``: the one image's key (an item with that key is
    replaced). Returns the new items' ids. An open gallery passed here sees the change at
    once."""
    from nearsight.index.gallery.update import add_images as add

    report = add(
        _folder(gallery),
        list(images),
        label=label,
        class_name=class_name,
        meta=meta,
        key=key,
        meta_types=meta_types,
        model=model,
        device=device,
        batch_size=batch_size,
        workers=workers,
    )
    _reload(gallery)
    return list(report.ids)


def remove_items(
    gallery: PathLike | Searcher,
    ids: Iterable[int] | None = None,
    *,
    keys: Iterable[str] | None = None,
) -> None:
    """Remove the items ``ids`` (or those with the ``keys`` of the gallery's key column) from
    the gallery through :func:`nearsight.index.gallery.update.remove_items` (what ``nearsight
    index remove`` runs): all of them, or none when one is unknown."""
    from nearsight.index.gallery.update import remove_items as remove

    remove(
        _folder(gallery),
        ids=None if ids is None else list(ids),
        keys=None if keys is None else [str(key) for key in keys],
    )
    _reload(gallery)


def get_item(
    gallery: PathLike | Searcher, item_id: int | None = None, *, key: str | None = None
) -> dict[str, Any]:
    """The catalog row (id, path, label, class_name, split, sha256, width, height, meta) of
    the item ``item_id``, or of the item whose key (any text) is ``key``: what ``nearsight index
    show`` prints (a tag column's value as its list of tags)."""
    from nearsight.index.catalog.list_columns import listed_row
    from nearsight.index.gallery.core import Gallery
    from nearsight.index.gallery.keys import item_of_key

    if item_id is not None and key is None:
        wanted: int | str = item_id
    elif key is not None and item_id is None:
        wanted = key
    else:
        raise NearsightError("get_item takes an id or a key, not both")
    if isinstance(gallery, Searcher):
        opened, owned = gallery.gallery, False
    else:
        opened, owned = Gallery.open(gallery), True
    try:
        row = item_of_key(opened, wanted) if isinstance(wanted, str) else opened.items([wanted])[0]
        return listed_row(row, opened.meta)
    finally:
        if owned:
            opened.close()


def _folder(gallery: PathLike | Searcher) -> Any:
    return gallery.path if isinstance(gallery, Searcher) else gallery


def _reload(gallery: PathLike | Searcher) -> None:
    if isinstance(gallery, Searcher):
        gallery.gallery.reload()
