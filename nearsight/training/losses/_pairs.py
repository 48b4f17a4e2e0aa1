"""Whole-batch helpers shared by the losses: pairwise distances and label masks.

Everything here works on the full [N, N] matrix of a batch; no Python loop over anchors or
pairs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar

import torch

Loss = TypeVar("Loss")  # the loss module a forward method belongs to
Rest = ParamSpec("Rest")  # the forward's parameters after the embeddings
_Forward = Callable[Concatenate[Loss, torch.Tensor, Rest], torch.Tensor]

# Squared distances below this are treated as this when taking the square root, so the
# gradient of sqrt stays finite (1 / (2 sqrt(eps))) for identical embeddings.
DISTANCE_EPS = 1e-12


def check_on_host(values: torch.Tensor) -> bool:
    """Whether a loss may check ``values`` on the host (a CPU tensor, run eagerly): inside a
    compiled or CUDA step reading them back would stop the device (and break the graph), so
    the check runs on the device instead (``torch._assert_async``)."""
    return values.device.type == "cpu" and not torch.compiler.is_compiling()


def pairwise_squared_distances(
    emb: torch.Tensor, other: torch.Tensor | None = None
) -> torch.Tensor:
    """[N, M] squared Euclidean distances between rows of ``emb`` and rows of ``other``
    (``emb`` itself when omitted), clamped at 0 against rounding."""
    other = emb if other is None else other
    sq_emb = (emb * emb).sum(dim=1, keepdim=True)
    sq_other = (other * other).sum(dim=1, keepdim=True).t()
    return (sq_emb + sq_other - 2.0 * emb @ other.t()).clamp(min=0.0)


def pairwise_distances(
    emb: torch.Tensor, other: torch.Tensor | None = None, eps: float = DISTANCE_EPS
) -> torch.Tensor:
    """[N, M] Euclidean (not squared) distances ``d_ij = ||emb_i - other_j||``.

    The gradient is finite everywhere: the squared distance is clamped below at ``eps`` before
    the square root (so identical embeddings give a distance of sqrt(eps) and a bounded
    gradient, not NaN). When ``other`` is omitted the diagonal is set to exactly 0 with no
    gradient (a point's distance to itself carries no information)."""
    distances = pairwise_squared_distances(emb, other).clamp(min=eps).sqrt()
    if other is None:
        eye = torch.eye(emb.shape[0], dtype=torch.bool, device=emb.device)
        distances = distances.masked_fill(eye, 0.0)
    return distances


def label_masks(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(positive_mask, negative_mask)``, both [N, N] bool: ``positive_mask[i, j]`` is true
    for ``j != i`` with the same label (P_i), ``negative_mask[i, j]`` for a different label
    (N_i)."""
    labels = labels.reshape(-1)
    same = labels[:, None] == labels[None, :]
    eye = torch.eye(labels.shape[0], dtype=torch.bool, device=labels.device)
    return same & ~eye, ~same


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """Mean of ``values`` over the true entries of ``mask`` along ``dim``; 0 (not NaN, with a
    zero gradient) where the mask has no true entry."""
    count = mask.sum(dim=dim).to(values.dtype)
    # where, not multiply: masked-out entries may be inf (e.g. logs of 0) and must not leak
    total = torch.where(mask, values, torch.zeros_like(values)).sum(dim=dim)
    return total / count.clamp(min=1.0)


def masked_softmax(logits: torch.Tensor, mask: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """Softmax of ``logits`` over the true entries of ``mask`` along ``dim`` (0 elsewhere).

    Computed with the row maximum subtracted, so logits of any size (e.g. a temperature of
    1000) do not overflow; a row with no true entry, or whose entries are all -inf, gives 0
    everywhere instead of NaN."""
    neg_inf = logits.new_full((), float("-inf"))  # a fill, not a host-to-device copy
    masked = torch.where(mask, logits, neg_inf)
    row_max = masked.amax(dim=dim, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    exp = torch.exp(masked - row_max)  # exactly 0 outside the mask
    total = exp.sum(dim=dim, keepdim=True)
    return exp / torch.where(total > 0, total, torch.ones_like(total))


def masked_logsumexp(values: torch.Tensor, mask: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """log(sum(exp(values))) over the true entries of ``mask`` along ``dim`` (keepdim);
    -inf for a row with no true entry."""
    neg_inf = values.new_full((), float("-inf"))
    return torch.logsumexp(torch.where(mask, values, neg_inf), dim=dim, keepdim=True)


def float32_loss(forward: _Forward[Loss, Rest]) -> _Forward[Loss, Rest]:
    """Decorator for a loss method ``(self, embeddings, labels, ...)``: compute it in float32
    when the embeddings come in bfloat16/float16 or an autocast region is active (float64
    stays float64). Half precision rounds distances near 1.4 to steps of 2^-7, which coarsens
    every margin, rank and softmax weight (measured: docs/decisions.md, "Losses in half
    precision"). The gradient still reaches the half-precision input through the cast."""

    @functools.wraps(forward)
    def wrapper(
        self: Loss, embeddings: torch.Tensor, *args: Rest.args, **kwargs: Rest.kwargs
    ) -> torch.Tensor:
        if embeddings.dtype in (torch.float16, torch.bfloat16):
            embeddings = embeddings.float()
        device_type = embeddings.device.type
        if not torch.amp.is_autocast_available(device_type):
            return forward(self, embeddings, *args, **kwargs)
        with torch.autocast(device_type, enabled=False):
            return forward(self, embeddings, *args, **kwargs)

    return wrapper
