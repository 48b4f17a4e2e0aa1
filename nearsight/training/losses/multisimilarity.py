"""Multi-similarity loss with its pair mining (baseline), through pytorch-metric-learning.

Paper: X. Wang, X. Han, W. Huang, D. Dong, M. R. Scott, "Multi-Similarity Loss with General
Pair Weighting for Deep Metric Learning", CVPR 2019: pairs mined as in the paper (a positive is
kept when S_ip - ``epsilon`` < max negative similarity, a negative when S_in + ``epsilon`` >
min positive similarity; ``MultiSimilarityMiner``), then the MS loss per anchor:
(1/alpha) log(1 + sum_P exp(-alpha (S_ip - base))) + (1/beta) log(1 + sum_N exp(beta (S_in - base))),
averaged over the anchors.

Defaults are pytorch-metric-learning's, which follow the paper: ``alpha`` 2, ``beta`` 50,
``base`` 0.5 (the paper's lambda), ``epsilon`` 0.1. Similarities are plain dot products of the
L2-normalised embeddings (cosine), without re-normalising.
"""

from __future__ import annotations

import torch
from pytorch_metric_learning import distances, losses, miners
from torch import nn


class MultiSimilarityLoss(nn.Module):
    """``loss(embeddings [N, D], labels [N]) -> scalar``."""

    def __init__(
        self, alpha: float = 2.0, beta: float = 50.0, base: float = 0.5, epsilon: float = 0.1
    ) -> None:
        super().__init__()
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.base = float(base)
        self.epsilon = float(epsilon)
        similarity = distances.DotProductSimilarity(normalize_embeddings=False)
        self.miner = miners.MultiSimilarityMiner(epsilon=self.epsilon, distance=similarity)
        self.loss = losses.MultiSimilarityLoss(
            alpha=self.alpha, beta=self.beta, base=self.base, distance=similarity
        )

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.loss(embeddings, labels, self.miner(embeddings, labels))
