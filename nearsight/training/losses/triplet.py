"""Triplet loss with semi-hard negative mining (baseline), through pytorch-metric-learning.

Paper: F. Schroff, D. Kalenichenko, J. Philbin, "FaceNet: A Unified Embedding for Face
Recognition and Clustering", CVPR 2015 (triplet loss of Sec. 3.1, semi-hard negatives of
Sec. 3.2): [d_ap - d_an + margin]_+ over the triplets whose negative is farther than the
positive but inside the margin, d_ap < d_an <= d_ap + margin (``TripletMarginMiner`` with
``type_of_triplets="semihard"``), averaged over the triplets with a non-zero loss.

Distances are Euclidean, not squared (pytorch-metric-learning's convention); ``margin`` 0.2 is
FaceNet's value for unit vectors. Embeddings arrive L2-normalised and are not re-normalised.
"""

from __future__ import annotations

import torch
from pytorch_metric_learning import distances, losses, miners
from torch import nn


class SemiHardTripletLoss(nn.Module):
    """``loss(embeddings [N, D], labels [N]) -> scalar``."""

    def __init__(self, margin: float = 0.2) -> None:
        super().__init__()
        self.margin = float(margin)
        distance = distances.LpDistance(normalize_embeddings=False)
        self.miner = miners.TripletMarginMiner(
            margin=self.margin, type_of_triplets="semihard", distance=distance
        )
        self.loss = losses.TripletMarginLoss(margin=self.margin, distance=distance)

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.loss(embeddings, labels, self.miner(embeddings, labels))
