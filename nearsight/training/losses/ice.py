"""Instance cross entropy (ICE).

Paper: X. Wang, E. Kodirov, Y. Hua, N. M. Robertson, "Instance Cross Entropy for Deep Metric
Learning", arXiv:1911.09976 (2019); definitions in docs/losses.md.

For anchor a and each positive p in P_a, one matching distribution over {p} ∪ N_a with the
similarities rescaled by ``scale`` s (eqs. 3-4 with eq. 11's rescaling):

    p_s(p|a)   = exp(s S_ap) / (exp(s S_ap) + sum_{n in N_a} exp(s S_an))
    p_s(n|a;p) = exp(s S_an) / (same denominator)

Weights (eqs. 13-14): w_ap = 1 - p_s(p|a), W_an = sum_{p in P_a} p_s(n|a;p), normalised per
anchor so that its positives and its negatives each carry 1/N:

    wt_ap = (1/N) w_ap / sum_p' w_ap'      wt_an = (1/N) W_an / sum_n' W_an'

ICE is *defined* by its gradient (eq. 15): dL/df_p = -wt_ap f_a and dL/df_n = +wt_an f_a,
summed over the anchors a. It is implemented as the surrogate

    L_grad = sum_a [ sum_n sg(wt_an) S_an - sum_p sg(wt_ap) S_ap ]

with f_a detached inside S (only positives and negatives receive gradient, as eq. 15 states;
``symmetric=True`` lets the anchor receive the mirror gradient too). The returned value is
``L_grad - sg(L_grad) + sg(L_log)``: it *reads* as L_log and *differentiates* as L_grad, where

    L_log = (1/N) sum_a mean_{p in P_a} -log p_s(p|a)            (eq. 5 with eq. 11)

Anchors without a positive in the batch (a class with one image) have no matching
distribution: all their weights are 0 and they add 0 to L_log, while still counting in the 1/N
(the paper's "treat all anchors equally, 1/N" with N the batch size). An anchor without
negatives has p_s(p|a) = 1, so w_ap = 0 and it contributes nothing either.

Everything is computed in log space (logsumexp), so a large ``scale`` (e.g. 1000) does not
overflow; the weights and L_log carry no gradient.
"""

from __future__ import annotations

import torch
from torch import nn

from nearsight.training.losses._pairs import (
    float32_loss,
    label_masks,
    masked_logsumexp,
    masked_mean,
    masked_softmax,
)


class InstanceCrossEntropyLoss(nn.Module):
    """ICE: ``loss(embeddings [N, D] L2-normalised, labels [N]) -> scalar``."""

    def __init__(self, scale: float = 64.0, symmetric: bool = False) -> None:
        super().__init__()
        self.scale = float(scale)
        self.symmetric = bool(symmetric)

    def extra_repr(self) -> str:
        return f"scale={self.scale}, symmetric={self.symmetric}"

    @torch.no_grad()
    def weights(
        self, embeddings: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(wt_pos, wt_neg, nll)``: the [N, N] normalised weights wt_ap and wt_an of eqs.
        13-14 (0 outside P_a / N_a) and the [N] per-anchor mean of -log p_s(p|a)."""
        return self._weights(embeddings @ embeddings.t(), labels)

    @torch.no_grad()
    def _weights(
        self, similarity: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = similarity.shape[0]
        positive, negative = label_masks(labels)
        logits = self.scale * similarity
        # log sum_{n in N_a} exp(s S_an): -inf for an anchor with no negatives
        lse_neg = masked_logsumexp(logits, negative)
        # log of the denominator of p_s(.|a;p), for every (a, p)
        log_denominator = torch.logaddexp(logits, lse_neg)
        log_p_match = logits - log_denominator  # log p_s(p|a)
        # w_ap = 1 - p_s(p|a) = sum_n exp(s S_an) / denominator, in log space (no cancellation)
        log_w_pos = lse_neg - log_denominator
        wt_pos = masked_softmax(log_w_pos, positive) / n
        # W_an = exp(s S_an) * sum_{p in P_a} 1 / denominator_ap
        log_w_neg = logits + masked_logsumexp(-log_denominator, positive)
        wt_neg = masked_softmax(log_w_neg, negative) / n
        nll = masked_mean(-log_p_match, positive)
        return wt_pos, wt_neg, nll

    @float32_loss
    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        n = embeddings.shape[0]
        anchors = embeddings if self.symmetric else embeddings.detach()
        similarity = anchors @ embeddings.t()  # row a: S_a. with f_a constant unless symmetric
        wt_pos, wt_neg, nll = self._weights(similarity.detach(), labels)
        loss_grad = ((wt_neg - wt_pos) * similarity).sum()
        loss_log = nll.sum() / n
        return loss_grad - loss_grad.detach() + loss_log
