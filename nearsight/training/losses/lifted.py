"""Lifted structured loss (baseline), through pytorch-metric-learning.

Paper: H. O. Song, Y. Xiang, S. Jegelka, S. Savarese, "Deep Metric Learning via Lifted
Structured Feature Embedding", CVPR 2016 (the smooth log-sum-exp form): for every positive pair
(i, j), J_ij = log(sum_{k in N_i} exp(neg_margin - d_ik) + sum_{l in N_j} exp(neg_margin - d_jl))
+ d_ij - pos_margin, and the loss is the mean of [J_ij]_+^2 / 2 over the positive pairs.

``neg_margin`` 1.0 is the paper's alpha; ``pos_margin`` 0. Distances are Euclidean, not squared.
Embeddings arrive L2-normalised and are not re-normalised.
"""

from __future__ import annotations

import torch
from pytorch_metric_learning import distances, losses
from torch import nn


class LiftedStructureLoss(nn.Module):
    """``loss(embeddings [N, D], labels [N]) -> scalar``."""

    def __init__(self, neg_margin: float = 1.0, pos_margin: float = 0.0) -> None:
        super().__init__()
        self.neg_margin = float(neg_margin)
        self.pos_margin = float(pos_margin)
        self.loss = losses.LiftedStructureLoss(
            neg_margin=self.neg_margin,
            pos_margin=self.pos_margin,
            distance=distances.LpDistance(normalize_embeddings=False),
        )

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.loss(embeddings, labels)
