"""Re-rankers as objects: a :class:`RerankSpec` made ready for one gallery, once.

:func:`build_reranker` is the one place that turns a spec into what runs it (the registry
:data:`BUILDERS`, by method): the vector re-rankers (alpha-QE, DBA, k-reciprocal) need nothing
opened; a pairwise one opens its ONNX file, checks it was trained for the gallery's model, and
opens the gallery's stored stage features when it scores by them. A :class:`Searcher` keeps
the ones it built (:class:`Rerankers`) until its gallery changes, so a search does not open,
stat or check the re-ranker file again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nearsight.core.errors import NearsightError
from nearsight.search.rerank.spec import NONE, RerankSpec, parse_rerank

if TYPE_CHECKING:  # the pairwise modules load onnxruntime
    from nearsight.index.gallery.core import Gallery
    from nearsight.search.rerank.pairwise import PairwiseReranker
    from nearsight.search.rerank.stage_query import StageEmbedder
    from nearsight.search.rerank.stage_store import StageStore


@dataclass(eq=False)
class Reranker:
    """A spec ready to re-rank one gallery's candidates. ``pairwise``: the open pairwise
    file (None for the vector methods); ``store``: the gallery's stage features, when that
    file scores by them."""

    spec: RerankSpec
    pairwise: PairwiseReranker | None = None
    store: StageStore | None = None

    def __post_init__(self) -> None:
        self._stage_lock = threading.Lock()
        self._stage_models: dict[tuple[tuple[str, ...] | None, str], StageEmbedder] = {}

    @property
    def active(self) -> bool:
        return self.spec.active

    @property
    def shown(self) -> str:
        return self.spec.shown

    @property
    def takes_query_features(self) -> bool:
        """Whether it scores query images by a trunk stage's features too (a query image is
        then embedded by the gallery's stage model, which gives both)."""
        return self.store is not None

    def stage_model(self, embedder: Any = None, optimization: str = "all") -> StageEmbedder | None:
        """The gallery's stage model that embeds query images for this re-ranker, on the
        providers of ``embedder``, opened once; None when it takes no stage features."""
        if self.store is None:
            return None
        from nearsight.search.rerank.stage_query import query_model

        providers = getattr(embedder, "providers", None)
        key = (tuple(providers) if providers is not None else None, optimization)
        with self._stage_lock:
            if key not in self._stage_models:
                self._stage_models[key] = query_model(self.store, providers, optimization)
            return self._stage_models[key]


def _plain(gallery: Gallery, spec: RerankSpec) -> Reranker:
    """The vector re-rankers (and none): numpy and FAISS over the gallery, nothing to open."""
    return Reranker(spec)


def _pairwise(gallery: Gallery, spec: RerankSpec) -> Reranker:
    """The learned pairwise re-ranker: its file opened and checked against the gallery's
    model, and the gallery's stage features when it scores by them (one-line errors)."""
    from nearsight.search.rerank import pairwise

    opened = pairwise.load_reranker(str(spec.params["model"]))
    opened.check_for(gallery.model_sha256, gallery.dim)
    store = opened.check_gallery(gallery.path, gallery.model_sha256)
    return Reranker(spec, opened, store)


BUILDERS: dict[str, Callable[[Gallery, RerankSpec], Reranker]] = {
    "none": _plain,
    "aqe": _plain,
    "dba": _plain,
    "dba+aqe": _plain,
    "kreciprocal": _plain,
    "pairwise": _pairwise,
}


def build_reranker(gallery: Gallery, spec: RerankSpec | str | None) -> Reranker:
    """``spec`` (parsed when text; None: none) made ready for ``gallery``: a one-line
    NearsightError when it is bad or cannot re-rank this gallery."""
    try:
        parsed = parse_rerank(spec)
    except ValueError as error:
        raise NearsightError(str(error)) from None
    return BUILDERS[parsed.method](gallery, parsed)


NO_RERANK = Reranker(NONE)


class Rerankers:
    """The re-rankers built for one gallery, by spec, kept while the gallery is the one they
    were built for (a reload, an add or a remove reads the gallery anew: they are built
    again). Safe to use from several threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._built: dict[str, Reranker] = {}
        self._for: object = None  # the gallery's meta they were built with

    def get(self, gallery: Gallery, spec: Reranker | RerankSpec | str | None) -> Reranker:
        """The re-ranker of ``spec`` for ``gallery`` (built on first use; one-line errors as
        :func:`build_reranker`'s); None: none."""
        if isinstance(spec, Reranker):
            return spec
        if spec is None or (isinstance(spec, RerankSpec) and not spec.active):
            return NO_RERANK
        key = str(spec)
        with self._lock:
            if self._for is not gallery.meta:  # read again since: build them again
                self._built, self._for = {}, gallery.meta
            found = self._built.get(key)
        if found is not None:
            return found
        built = build_reranker(gallery, spec)
        with self._lock:
            if self._for is gallery.meta:
                self._built.setdefault(str(built.spec), built)
                if key != str(built.spec):
                    self._built.setdefault(key, built)
        return built
