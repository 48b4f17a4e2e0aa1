"""The learned pairwise re-ranker's training side: the scorer (torch), its fitting on a
training split's embeddings, and its export to the ONNX file that
``--rerank pairwise:model=FILE`` runs (nearsight.search.rerank.pairwise, no torch)."""

from nearsight.training.pairwise.export import export_scorer
from nearsight.training.pairwise.fit import FitReport, FitSettings, fit_scorer
from nearsight.training.pairwise.scorer import PairScorer

__all__ = ["FitReport", "FitSettings", "PairScorer", "export_scorer", "fit_scorer"]
