"""A gallery's facts in one place: what ``nearsight index info`` prints, what REST's
``/api/galleries`` and ``/api/health`` answer and what the page's header and Summary tab
show all come from :func:`gallery_summary`, so they can never disagree."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from nearsight.index.catalog.list_columns import gallery_list_columns

if TYPE_CHECKING:
    from nearsight.index.gallery.core import Gallery


TAG_TYPE = "list[str]"  # a tag column's type as shown: each item holds a list of text values


def gallery_summary(gallery: Gallery) -> dict[str, Any]:
    """The gallery's facts as plain JSON values: ``items``, ``labelled``, ``classes``,
    ``dim``, ``metric``, ``index_type``, ``model`` (the model file's name; never a folder of
    the server's), ``model_sha256``, ``key_column`` (None without one), ``columns`` (each
    metadata column's type, by name, sorted: a tag column, ``--list-column``, is
    :data:`TAG_TYPE`), ``created``, ``dataset`` and ``split`` (None when not recorded)."""
    meta = gallery.meta
    tags = gallery_list_columns(meta)
    types = {
        name: TAG_TYPE if name in tags else kind for name, kind in gallery.column_types().items()
    }
    labelled = np.asarray(gallery.labels)[np.asarray(gallery.labels) >= 0]
    model = meta.get("model")
    return {
        "items": len(gallery),
        "labelled": len(labelled),
        "classes": len(np.unique(labelled)),
        "dim": int(gallery.dim),
        "metric": str(meta.get("metric", "l2")),
        "index_type": str(gallery.index_type),
        "model": Path(str(model)).name if model else None,
        "model_sha256": str(meta.get("model_sha256", "")),
        "key_column": meta.get("key_column"),
        "columns": dict(sorted(types.items())),
        "created": meta.get("created"),
        "dataset": meta.get("dataset"),
        "split": meta.get("split"),
    }
