"""Multi-class N-pair loss (baseline), through pytorch-metric-learning.

Paper: K. Sohn, "Improved Deep Metric Learning with Multi-class N-pair Loss Objective",
NeurIPS 2016 (the multi-class N-pair loss): for N pairs (x_i, x_i+) of N different classes,
(1/N) sum_i log(1 + sum_{j != i} exp(f_i . f_j+ - f_i . f_i+)), a softmax cross entropy over
dot products. pytorch-metric-learning forms one (anchor, positive) pair per class present in the
batch (the first such pair of each label, so any m-per-class batch works); classes with a
single image are left out.

No parameters. The dot products are taken on the L2-normalised embeddings as they are (not
re-normalised), so Sohn's L2 regulariser on the embedding norms is unnecessary.
"""

from __future__ import annotations

import torch
from pytorch_metric_learning import distances, losses
from torch import nn


class NPairsLoss(nn.Module):
    """``loss(embeddings [N, D], labels [N]) -> scalar``."""

    def __init__(self) -> None:
        super().__init__()
        self.loss = losses.NPairsLoss(
            distance=distances.DotProductSimilarity(normalize_embeddings=False)
        )

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.loss(embeddings, labels)
