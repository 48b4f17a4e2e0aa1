"""Evaluating a gallery by the papers' protocol (data.metrics) on its stored vectors.

Every labelled item queries all the other labelled items (unlabelled ones are left out). The
vectors are embeddings.npy (memory-mapped) or, for a gallery without it, read back by
index.vector_store: in memory within the gallery's memory budget, else gathered into a
temporary memory-mapped file, so the chunked exact kNN of data.metrics stays exact and
memory-bounded. Vectors decoded from PQ codes (a compressed gallery with neither the file nor
its source files) are approximate: an :class:`ApproximateVectorsWarning` says so.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from nearsight.core.errors import NearsightError
from nearsight.data.metrics.retrieval import CUB_KS, SOP_KS
from nearsight.data.metrics.retrieval import default_ks as ks_by_size
from nearsight.index.vector_store import ApproximateVectorsWarning
from nearsight.search.rerank.evaluate import evaluate_reranked
from nearsight.search.rerank.rerankers import build_reranker
from nearsight.search.rerank.spec import RerankSpec, parse_rerank

if TYPE_CHECKING:  # index.gallery imports this module
    from nearsight.index.gallery.core import Gallery

# NMI's k-means++ seeding is O(N k); past this many classes use faiss's AFK-MC2 approximation
EXACT_KMEANSPP_MAX_CLASSES = 1000


def default_ks(gallery: Gallery) -> tuple[int, ...]:
    """SOP's k values for a gallery of the sop dataset, CUB/CARS's for other datasets, by size
    for a gallery of loose images."""
    dataset = gallery.meta.get("dataset")
    if dataset == "sop":
        return SOP_KS
    if dataset:
        return CUB_KS
    return ks_by_size(int((gallery.labels >= 0).sum()))


def evaluate_gallery(
    gallery: Gallery,
    ks: Sequence[int] | None = None,
    queries: int | None = None,
    rerank: RerankSpec | str | None = None,
    with_nmi: bool = True,
    nmi_average: str = "arithmetic",
) -> dict[str, float | int]:
    """nearsight.data.metrics.retrieval.evaluate's dict (recall@k..., nmi, map@r, queries) of ``gallery``;
    ``queries``: only a seeded sample of that many labelled items query; ``rerank``: each
    query's neighbours re-ranked (nearsight.search.rerank), its own item excluded from every
    expansion; ``nmi_average``: NMI's normalisation (nearsight.data.metrics.nmi.NMI_AVERAGES)."""
    spec = parse_rerank(rerank)
    labelled = gallery.labels >= 0
    if labelled.sum() < 2:
        raise NearsightError(
            f"gallery {gallery.path} has {int(labelled.sum())} labelled items: evaluation "
            "needs at least 2"
        )
    if not gallery.vectors_exact:
        warnings.warn(
            f"gallery {gallery.path} has no embeddings.npy and a compressed "
            f"{gallery.index_type} index: evaluating the vectors decoded from its codes "
            "(approximate)",
            ApproximateVectorsWarning,
            stacklevel=3,
        )
    labels = gallery.labels
    if labelled.all():
        vectors = gallery.embeddings
    else:
        labels = labels[labelled]
        vectors = gallery.vector_rows(gallery.ids[labelled])  # within the budget, or mapped
    classes = len(np.unique(labels))
    init = "k-means++" if classes <= EXACT_KMEANSPP_MAX_CLASSES else "afk-mc2"
    ks = tuple(ks or default_ks(gallery))
    side = None
    store = build_reranker(gallery, spec).store  # a re-ranker of stage features: their store
    if store is not None:  # the labelled items' stored stage features, in their order
        side = store.side_of(gallery.ids[labelled])
    return evaluate_reranked(
        vectors,
        labels,
        ks,
        spec,
        model_sha256=gallery.model_sha256,
        side=side,
        nmi_init=init,
        queries=queries,
        with_nmi=with_nmi,
        nmi_average=nmi_average,
    )
