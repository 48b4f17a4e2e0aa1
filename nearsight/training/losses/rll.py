"""Ranked list loss (RLL).

Paper: X. Wang, Y. Hua, E. Kodirov, G. Hu, R. Garnier, N. M. Robertson, "Ranked List Loss for
Deep Metric Learning", CVPR 2019; definitions in docs/losses.md.

Every image i of the batch is a query whose ranked list is the rest of the batch. With
d_ij = ||f_i - f_j||_2, the negative boundary ``alpha`` and the ``margin`` m:

    mined sets (Sec. 3.2): P*_i = {j in P_i : d_ij > alpha - m},  N*_i = {j in N_i : d_ij < alpha}
    eq. 9:   w_ij = exp(T (alpha - d_ij)) for j in N*_i   (``temperature`` T; constants)
    eq. 11:  L_P(i) = (1/|P*_i|) sum_{j in P*_i} (d_ij - (alpha - m))
    eq. 12:  L_N(i) = sum_{j in N*_i} w_ij (alpha - d_ij) / sum_{j in N*_i} w_ij
    eq. 13:  L(i) = L_P(i) + lam L_N(i)
    eq. 14:  L = (1/N) sum_i L(i)      N the batch size

(on the mined sets the hinges of eq. 8 are positive, so they are written without [.]_+.)
"In the ranked list of x_i, we regard the features of other examples as constants" (end of
Sec. 3.2): list i uses d_ij = ||f_i - sg(f_j)||, so it updates only its query f_i.

Anchors with an empty mined set contribute 0 to that term (never NaN) and still count in eq.
14's 1/N over the whole batch. The softmax-like weights of eq. 12 are computed in log space
with the row maximum subtracted, so a large temperature (e.g. 1000) cannot overflow.
"""

from __future__ import annotations

import torch
from torch import nn

from nearsight.training.losses._pairs import (
    float32_loss,
    label_masks,
    masked_softmax,
    pairwise_distances,
)


class RankedListLoss(nn.Module):
    """RLL: ``loss(embeddings [N, D] L2-normalised, labels [N]) -> scalar``."""

    def __init__(
        self, alpha: float = 1.2, margin: float = 0.4, temperature: float = 10.0, lam: float = 1.0
    ) -> None:
        super().__init__()
        self.alpha = float(alpha)
        self.margin = float(margin)
        self.temperature = float(temperature)
        self.lam = float(lam)

    def extra_repr(self) -> str:
        return (
            f"alpha={self.alpha}, margin={self.margin}, "
            f"temperature={self.temperature}, lam={self.lam}"
        )

    @float32_loss
    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        n = embeddings.shape[0]
        positive, negative = label_masks(labels)
        # row i: distances from the live query f_i to the constant gallery sg(f_j)
        distances = pairwise_distances(embeddings, embeddings.detach())
        positive_boundary = self.alpha - self.margin
        mined_positive = positive & (distances > positive_boundary)
        mined_negative = negative & (distances < self.alpha)

        positive_hinge = torch.where(mined_positive, distances - positive_boundary, 0.0)
        positive_count = mined_positive.sum(dim=1).clamp(min=1)
        loss_positive = positive_hinge.sum(dim=1) / positive_count

        negative_hinge = self.alpha - distances
        with torch.no_grad():
            weights = masked_softmax(self.temperature * negative_hinge, mined_negative)
        # weights are 0 outside N*_i, and the hinge is finite everywhere
        loss_negative = (weights * negative_hinge).sum(dim=1)
        return (loss_positive + self.lam * loss_negative).sum() / n
