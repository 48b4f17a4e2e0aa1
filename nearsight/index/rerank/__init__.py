"""Re-ranking of base-search candidates: alpha-QE, DBA, k-reciprocal (numpy + FAISS, no torch).

:func:`parse_rerank` reads a spec (``aqe:k=2,alpha=3``); :func:`rerank` re-orders candidates
given a :class:`RerankSource`; :func:`reranked_search` does it over a gallery's index.
"""

from nearsight.index.rerank.aqe import alpha_qe
from nearsight.index.rerank.dba import dba
from nearsight.index.rerank.kreciprocal import k_reciprocal_distance
from nearsight.index.rerank.pipeline import RerankSource, rerank
from nearsight.index.rerank.sources import GallerySource, MatrixSource
from nearsight.index.rerank.spec import NONE, RerankSpec, parse_rerank

__all__ = [
    "NONE",
    "GallerySource",
    "MatrixSource",
    "RerankSource",
    "RerankSpec",
    "alpha_qe",
    "dba",
    "k_reciprocal_distance",
    "parse_rerank",
    "rerank",
]
