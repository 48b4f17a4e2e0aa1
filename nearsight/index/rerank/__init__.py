"""Re-ranking of base-search candidates (numpy only; see issue 24)."""

from nearsight.index.rerank.apply import rerank_candidates
from nearsight.index.rerank.aqe import alpha_qe
from nearsight.index.rerank.dba import dba
from nearsight.index.rerank.kreciprocal import k_reciprocal_distance
from nearsight.index.rerank.spec import RerankSpec, parse_rerank

__all__ = ["RerankSpec", "alpha_qe", "dba", "k_reciprocal_distance", "parse_rerank", "rerank_candidates"]
