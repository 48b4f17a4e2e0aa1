"""Nonlinear rank approximation (NRA) loss.

Paper: K. Schall, K. U. Barthel, N. Hezel, K. Jung, "Deep Metric Learning using Similarities
from Nonlinear Rank Approximations", MMSP 2019 (slides
"Nonlinear Rank Approximation", "Evaluation of Nonlinear Transfer Function w", "NRA Loss
Function"); definitions in docs/losses.md.

For anchor i, over its row j != i, with d_ij = ||f_i - f_j||_2:

    Dmin_i = min_j d_ij,  Dmax_i = max_j d_ij
    r_ij = (d_ij - Dmin_i) / (Dmax_i - Dmin_i)                        approximated normalised rank
    w(r; alpha) = 0.5 (2r)^alpha          for r in [0, 1/2)
                = 1 - 0.5 (2(1-r))^alpha  for r in [1/2, 1]           nonlinear transfer
    s_ij = 1 - w(r_ij)                                                 similarity
    D+_i = max_{j in P_i} d_ij (hardest positive),  D-_i = min_{j in N_i} d_ij (hardest negative)
    J = -(1/N) sum_i [ log s(r(D+_i)) + log(1 - s(r(D-_i))) ]

s is clamped into [1e-7, 1 - 1e-7]; Dmin and Dmax are not detached (the gradient flows through
them as through D+ and D-). An anchor without positives (a class with one image in the batch)
contributes only its negative term, one without negatives only its positive term, and both
still count in the 1/N over the whole batch (N the batch size), as in the slide's 1/m.
Rows whose distances are all equal (Dmax = Dmin, e.g. identical embeddings) get r = 0.

Second reading, ``include_anchor=True``: the row includes j = i (d_ii = 0), so Dmin_i = 0 and
r_ij = d_ij / Dmax_i; everything else as above. The slides' "D_i,min" fits the default better;
a row minimum over a distance matrix with its zero diagonal gives this one.

Where the gradient vanishes (default reading): when an anchor's nearest neighbour is a
negative, D-_i = Dmin_i, so r(D-_i) is identically 0 and the negative term sits at the clamp
with no gradient of its own. The positive term is still alive there: it depends on Dmin_i, which
is that same negative's distance, so it moves the negative (and the anchor) all the same. Only
anchors whose positive term is dead too (the hardest positive is the row's farthest sample, so
r(D+_i) is identically 1) get no gradient at all, a small share of a batch. With
``include_anchor=True`` Dmin_i = 0 and the negative term stays alive when the nearest
neighbour is a negative. Measured learning of both readings: bench/seed_losses_synth.py.
"""

from __future__ import annotations

import torch
from torch import nn

from nearsight.training.losses._pairs import float32_loss, label_masks, pairwise_distances

SIMILARITY_CLAMP = 1e-7


def _safe_power(base: torch.Tensor, alpha: float) -> torch.Tensor:
    """base ** alpha for base >= 0, with 0 ** alpha = 0 and a zero (not infinite) gradient
    there, even for alpha < 1."""
    positive = base > 0
    powered = torch.where(positive, base, torch.ones_like(base)) ** alpha
    return torch.where(positive, powered, torch.zeros_like(base))


def rank_transfer(rank: torch.Tensor, alpha: float) -> torch.Tensor:
    """The transfer function w(r; alpha) on ranks in [0, 1], with a finite gradient
    everywhere."""
    low = 0.5 * _safe_power(2.0 * rank, alpha)
    high = 1.0 - 0.5 * _safe_power(2.0 * (1.0 - rank), alpha)
    return torch.where(rank < 0.5, low, high)


def log_similarities(rank: torch.Tensor, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log s, log(1 - s))`` for s = 1 - w(r; alpha) clamped into [1e-7, 1 - 1e-7].

    Each branch of w gives the *small* one of s and 1 - s exactly (0.5 (2r)^alpha = w for
    r < 1/2, 0.5 (2(1-r))^alpha = s for r >= 1/2), so the clamp is applied to that small
    number and the other log is log1p(-small): 1 - 1e-7 is not representable in float32, and
    clamping s itself there would move the saturated log(1 - s) (docs/decisions.md, "Losses in
    half precision")."""
    below_half = rank < 0.5
    # the small quantity of each branch lies in [0, 1/2]: clamping it below at 1e-7 is the
    # clamp of s into [1e-7, 1 - 1e-7]; the cap at 3/4 (never reached by the branch taken)
    # keeps log1p(-x) of the branch not taken finite, so torch.where passes no NaN gradient
    small_low = (0.5 * _safe_power(2.0 * rank, alpha)).clamp(SIMILARITY_CLAMP, 0.75)
    small_high = (0.5 * _safe_power(2.0 * (1.0 - rank), alpha)).clamp(SIMILARITY_CLAMP, 0.75)
    log_s = torch.where(below_half, torch.log1p(-small_low), torch.log(small_high))
    log_one_minus_s = torch.where(below_half, torch.log(small_low), torch.log1p(-small_high))
    return log_s, log_one_minus_s


class NonlinearRankApproximationLoss(nn.Module):
    """NRA: ``loss(embeddings [N, D] L2-normalised, labels [N]) -> scalar``."""

    def __init__(self, alpha: float = 2.0, include_anchor: bool = False) -> None:
        super().__init__()
        self.alpha = float(alpha)
        self.include_anchor = bool(include_anchor)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, include_anchor={self.include_anchor}"

    @float32_loss
    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        n = embeddings.shape[0]
        if n < 2:  # no row to rank
            return embeddings.sum() * 0.0
        positive, negative = label_masks(labels)
        distances = pairwise_distances(embeddings)
        eye = torch.eye(n, dtype=torch.bool, device=embeddings.device)
        # the diagonal is exactly 0 with no gradient: it is the row minimum when the row
        # includes the anchor, and is kept out of the min and max otherwise
        if self.include_anchor:
            d_min = torch.zeros(n, dtype=distances.dtype, device=distances.device)
        else:
            d_min = distances.masked_fill(eye, float("inf")).amin(dim=1)
        d_max = distances.masked_fill(eye, float("-inf")).amax(dim=1)
        span = d_max - d_min
        span = torch.where(span > 0, span, torch.ones_like(span))  # Dmax = Dmin: r = 0
        # rows without positives (negatives) take an in-range stand-in, masked out below
        hardest_positive = torch.where(positive, distances, d_min[:, None]).amax(dim=1)
        hardest_negative = torch.where(negative, distances, d_max[:, None]).amin(dim=1)
        rank_positive = (hardest_positive - d_min) / span
        rank_negative = (hardest_negative - d_min) / span

        log_s_positive, _ = log_similarities(rank_positive, self.alpha)
        _, log_one_minus_s_negative = log_similarities(rank_negative, self.alpha)
        zero = torch.zeros_like(log_s_positive)
        log_likelihood = torch.where(positive.any(dim=1), log_s_positive, zero)
        log_likelihood = log_likelihood + torch.where(
            negative.any(dim=1), log_one_minus_s_negative, zero
        )
        return -log_likelihood.sum() / n
