"""nearsight: image retrieval built on deep metric learning.

The repository's folders are this package's sub-packages, lowest first: ``nearsight.core``
(errors, atomic writes), ``nearsight.models`` (the embedding network, export, embedders),
``nearsight.data`` (images, datasets, item metadata, metrics), ``nearsight.index`` (the gallery
store: catalog, FAISS index, builder), ``nearsight.search`` (the one search route, re-ranking,
results, evaluation) beside ``nearsight.training`` (losses, samplers, trainer), and
``nearsight.app`` (CLI, page, REST) on top.

The entry points for notebooks and scripts, loaded on first use (``import nearsight`` itself
imports neither torch nor onnxruntime):

- :func:`open_gallery` (path, model=None) -> a :class:`Searcher` with ``.search(image, k=8)``,
  ``.search_many(images)``, ``.search_item(id)``, ``.search_vector(v)``, ``.vector(id)``,
  ``.evaluate()`` and ``len()`` (each search takes ``offset=`` for a page and ``group_by=``
  for one answer per value of a column); results are lists of :class:`Neighbour`, with
  ``.to_pandas()``, and show as a grid in Jupyter;
- :func:`build_gallery` (model, out, dataset=... | images=...) -> the new gallery, opened,
  with its :class:`BuildReport` (the index layer's builder, which ``nearsight index build``
  runs too; ``model="timm:NAME"`` builds a zero-shot gallery of a pretrained timm model,
  needing ``[train]``); :func:`add_images` (gallery, images, ...) -> the new ids;
  :func:`remove_items` (gallery, ids | keys=...); :func:`get_item` (gallery, id | key=...) ->
  one item: the typed jobs ``nearsight index add | remove | show`` run;
- :func:`load_embedder` (model_path) -> an embedder with ``.embed_images(images)``;
- :func:`export` (checkpoint, out, ...) -> the ONNX model, parity-checked (needs ``[train]``);
- :func:`train` (config, out_dir, *, resume=False) -> a training run (needs ``[train]``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the module that defines it
_API = {
    "open_gallery": "nearsight.search.searcher",
    "Searcher": "nearsight.search.searcher",
    "Neighbour": "nearsight.search.neighbour",
    "SearchResults": "nearsight.search.results",
    "ResultsList": "nearsight.search.results",
    "build_gallery": "nearsight.app.api",
    "BuildReport": "nearsight.index.gallery.build",
    "add_images": "nearsight.app.api",
    "remove_items": "nearsight.app.api",
    "get_item": "nearsight.app.api",
    "load_embedder": "nearsight.models.loading",
    "export": "nearsight.models.export",
    "train": "nearsight.training.run",
    "NearsightError": "nearsight.core.errors",
}

__all__ = [
    "BuildReport",
    "NearsightError",
    "ResultsList",
    "Neighbour",
    "SearchResults",
    "Searcher",
    "add_images",
    "build_gallery",
    "export",
    "get_item",
    "load_embedder",
    "open_gallery",
    "remove_items",
    "train",
]

if TYPE_CHECKING:
    from nearsight.app.api import add_images, build_gallery, get_item, remove_items
    from nearsight.core.errors import NearsightError
    from nearsight.index.gallery.build import BuildReport
    from nearsight.models.export import export
    from nearsight.models.loading import load_embedder
    from nearsight.search.neighbour import Neighbour
    from nearsight.search.results import ResultsList, SearchResults
    from nearsight.search.searcher import Searcher, open_gallery
    from nearsight.training.run import train


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'nearsight' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as error:  # e.g. nearsight.export with the serving set only
        from nearsight.core.errors import NearsightError
        from nearsight.core.extras import missing_extra

        line = missing_extra(error)
        if line is None:
            raise
        raise NearsightError(f"nearsight.{name}: {line}") from None
    globals()[name] = value  # the next access skips this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
