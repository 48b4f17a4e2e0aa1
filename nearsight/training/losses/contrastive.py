"""Contrastive loss (baseline), through pytorch-metric-learning.

Paper: R. Hadsell, S. Chopra, Y. LeCun, "Dimensionality Reduction by Learning an Invariant
Mapping", CVPR 2006, in pytorch-metric-learning's form: over all positive pairs
[d_ij - pos_margin]_+ and all negative pairs [neg_margin - d_ij]_+ (Euclidean d, not squared),
each averaged over the pairs with a non-zero loss (``AvgNonZeroReducer``) and summed.

Defaults for unit vectors (d in [0, 2], two random directions in high dimension lie at about
sqrt(2)): positives are pulled together (``pos_margin`` 0) and negatives closer than
``neg_margin`` 1.0 (an angle under 60 degrees) are pushed apart. Embeddings arrive
L2-normalised and are not re-normalised.
"""

from __future__ import annotations

import torch
from pytorch_metric_learning import distances, losses
from torch import nn


class ContrastiveLoss(nn.Module):
    """``loss(embeddings [N, D], labels [N]) -> scalar``."""

    def __init__(self, pos_margin: float = 0.0, neg_margin: float = 1.0) -> None:
        super().__init__()
        self.pos_margin = float(pos_margin)
        self.neg_margin = float(neg_margin)
        self.loss = losses.ContrastiveLoss(
            pos_margin=self.pos_margin,
            neg_margin=self.neg_margin,
            distance=distances.LpDistance(normalize_embeddings=False),
        )

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.loss(embeddings, labels)
