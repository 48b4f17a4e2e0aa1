"""Re-ranking of base-search candidates: alpha-QE, DBA, k-reciprocal (numpy + FAISS, no torch).

:func:`parse_rerank` reads a spec (``aqe:k=2,alpha=3``); :func:`rerank` re-orders candidates
given a :class:`RerankSource`; ``Gallery.search(..., rerank=spec)`` does it over a gallery's
index. The other names load on first use, so the command line's option parsing stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

from nearsight.search.rerank.spec import NONE, RerankSpec, parse_rerank

_LAZY = {
    "alpha_qe": "aqe",
    "k_reciprocal_distance": "kreciprocal",
    "RerankSource": "pipeline",
    "rerank": "pipeline",
    "OpenGallerySource": "sources",
    "MatrixSource": "sources",
}

__all__ = ["NONE", "RerankSpec", "parse_rerank", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
