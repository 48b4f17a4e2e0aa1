"""Margin loss with distance-weighted sampling (baseline), through pytorch-metric-learning.

Paper: C.-Y. Wu, R. Manmatha, A. J. Smola, P. Krähenbühl, "Sampling Matters in Deep Embedding
Learning", ICCV 2017: the margin-based loss (Sec. 5) [margin + y_ij (d_ij - beta)]_+ on
triplets whose negative is drawn with probability proportional to 1/q(d) (distance weighted
sampling, Sec. 4; q the density of distances between random points on the unit sphere), with
d clipped below at ``cutoff`` 0.5 and negatives beyond ``nonzero_loss_cutoff`` 1.4 never drawn
(``DistanceWeightedMiner``). The loss is divided by the number of pairs with a non-zero loss.

Defaults are the paper's: ``margin`` 0.2, ``beta`` 1.2; ``learn_beta=True`` makes beta a
parameter of this module (the paper learns it; it must then be given to the optimiser).
Sampling draws from torch's global random generator. Embeddings arrive L2-normalised; the loss
does not re-normalise them (the miner does internally, as pytorch-metric-learning requires, which
changes nothing for unit vectors and carries no gradient).
"""

from __future__ import annotations

import torch
from pytorch_metric_learning import distances, losses, miners
from torch import nn


class MarginLoss(nn.Module):
    """``loss(embeddings [N, D], labels [N]) -> scalar``."""

    def __init__(
        self,
        margin: float = 0.2,
        beta: float = 1.2,
        learn_beta: bool = False,
        cutoff: float = 0.5,
        nonzero_loss_cutoff: float = 1.4,
    ) -> None:
        super().__init__()
        self.margin = float(margin)
        self.learn_beta = bool(learn_beta)
        self.cutoff = float(cutoff)
        self.nonzero_loss_cutoff = float(nonzero_loss_cutoff)
        self.miner = miners.DistanceWeightedMiner(
            cutoff=self.cutoff, nonzero_loss_cutoff=self.nonzero_loss_cutoff
        )
        self.loss = losses.MarginLoss(
            margin=self.margin,
            beta=float(beta),
            learn_beta=self.learn_beta,
            distance=distances.LpDistance(normalize_embeddings=False),
        )

    @property
    def parameter_role(self) -> str:
        """A learnt beta trains with the embedding (nearsight/training/loss_roles.py)."""
        return "joint" if self.learn_beta else "none"

    def parameter_groups(self) -> list[dict]:
        return [{"name": "margin_beta", "params": [self.loss.beta]}] if self.learn_beta else []

    @property
    def beta(self) -> float:
        return float(self.loss.beta.detach().reshape(-1)[0])

    def logged_scalars(self) -> dict[str, float]:
        return {"margin_beta": self.beta}

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.loss(embeddings, labels, self.miner(embeddings, labels))
