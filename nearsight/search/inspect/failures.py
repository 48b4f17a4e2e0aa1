"""Leave-one-out failures as tables to share: the page's failure analysis
(:mod:`nearsight.search.analysis`) with each item's key and path, the classes with the lowest
Recall@1 and the class pairs most often confused."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from nearsight.core.errors import NearsightError
from nearsight.search.analysis import Failure, confused_pairs, leave_one_out_failures
from nearsight.search.evaluate import evaluate_gallery
from nearsight.search.inspect.items import GalleryLike, Items, gallery_items, opened

if TYPE_CHECKING:
    import pandas as pd

    from nearsight.index.gallery.core import Gallery

FAILURE_COLUMNS = [
    "id", "key", "path", "class",
    "top1_id", "top1_key", "top1_path", "top1_class", "top1_distance",
    "positive_id", "positive_key", "positive_path", "positive_distance",
    "margin",
]  # fmt: skip


@dataclass
class FailureReport:
    """A gallery's leave-one-out picture as tables."""

    metrics: dict[str, float | int]  # evaluate_gallery's (recall@k..., nmi, map@r, queries)
    failures: pd.DataFrame  # FAILURE_COLUMNS, worst (largest margin) first
    classes: pd.DataFrame  # per class: items, failures, recall@1; lowest recall first
    pairs: pd.DataFrame  # class a, class b, failures; most first
    items: Items
    failure_list: list[Failure]


def gallery_failures(gallery: Gallery, items: Items | None = None) -> list[Failure]:
    """The leave-one-out failures of an open gallery (the page's list), worst first."""
    labelled = int((gallery.labels >= 0).sum())
    if labelled < 2:
        raise NearsightError(
            f"gallery {gallery.path} has {labelled} labelled items: leave-one-out needs at least 2"
        )
    items = items or gallery_items(gallery)
    embeddings = np.asarray(gallery.embeddings, dtype=np.float32)
    return leave_one_out_failures(gallery.search, embeddings, items.ids, items.labels)


def failures_frame(failures: list[Failure], items: Items) -> pd.DataFrame:
    """One row per failure (:data:`FAILURE_COLUMNS`), in the order given."""
    import pandas as pd

    row_of = {int(item_id): row for row, item_id in enumerate(items.ids)}

    def rows(ids: list[int | None]) -> np.ndarray:
        return np.array([-1 if i is None else row_of.get(int(i), -1) for i in ids], np.int64)

    query = rows([f.id for f in failures])
    columns: dict[str, list] = {
        **items.describe(query),
        "class": [items.class_name(f.label) for f in failures],
        **items.describe(rows([f.top1_id for f in failures]), "top1_"),
        "top1_class": [items.class_name(f.top1_label) for f in failures],
        "top1_distance": [round(f.top1_distance, 6) for f in failures],
        **items.describe(rows([f.positive_id for f in failures]), "positive_"),
        "positive_distance": [
            None if f.positive_distance is None else round(f.positive_distance, 6) for f in failures
        ],
        "margin": [None if f.margin is None else round(f.margin, 6) for f in failures],
    }
    return pd.DataFrame(columns, columns=FAILURE_COLUMNS)


def class_recall_frame(failures: list[Failure], items: Items) -> pd.DataFrame:
    """Per class: labelled items, failures and leave-one-out Recall@1; lowest first."""
    import pandas as pd

    sizes = Counter(int(label) for label in items.labels if label >= 0)
    missed = Counter(f.label for f in failures)
    rows = [
        (items.class_name(label), size, missed[label], 1.0 - missed[label] / size)
        for label, size in sizes.items()
    ]
    frame = pd.DataFrame(rows, columns=["class", "items", "failures", "recall@1"])
    return frame.sort_values(["recall@1", "class"], kind="stable", ignore_index=True)


def pairs_frame(failures: list[Failure], items: Items, limit: int = 50) -> pd.DataFrame:
    import pandas as pd

    rows = [
        (items.class_name(a), items.class_name(b), count)
        for a, b, count in confused_pairs(failures, limit)
    ]
    return pd.DataFrame(rows, columns=["class a", "class b", "failures"])


def inspect_failures(gallery: GalleryLike, ks: tuple[int, ...] | None = None) -> FailureReport:
    """The failures, worst classes, confused pairs and Recall@k of a gallery (a folder or an
    open :class:`~nearsight.index.gallery.core.Gallery`)."""
    with opened(gallery) as open_gallery:
        items = gallery_items(open_gallery)
        failures = gallery_failures(open_gallery, items)
        metrics = evaluate_gallery(open_gallery, ks)
    return FailureReport(
        metrics=metrics,
        failures=failures_frame(failures, items),
        classes=class_recall_frame(failures, items),
        pairs=pairs_frame(failures, items),
        items=items,
        failure_list=failures,
    )
