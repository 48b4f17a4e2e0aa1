"""Balanced contrastive loss with importance sampling (Hong, Park and Kim, "Deep Metric Learning
via Weighted Contrastive Loss").

Implements the mini-batch loss of eq. 23,
    (1/B) sum_{(i,j)} W_ij [ Y_ij g(d_ij) + (1 - Y_ij) eta_ij h(d_ij) ],
with g(d) = d^2 and h(d) = max(0, alpha - d)^2 (eq. 5), the balanced weights of eq. 15
    eta_ij = lambda / (L - 1) * (N_yi - 1) / N_yj
and the importance weights W = P_U / Q of eqs. 24-25, P_U = 1 / (N (N - 1)) being the uniform
distribution over the ordered pairs of the training set and Q the distribution of eq. 8
(p-random design) or eq. 9 ((m,n)-group design). See docs/losses.md.

Eq. 16 prints eta_ij = lambda/(L-1) (N_yi - 1)/N_yi; that is a typo: eq. 15 right above it, the
summary at the end of section 5.2 and eq. 17 (lambda_traditional = N_yj (L-1)/(N_yi - 1), the
lambda that makes eq. 15's eta equal 1) all have N_yj in the denominator, and the derivation
from eq. 14 (one negative K_l drawn uniformly from each class l, weight lambda/(L-1), summed
over the N_yi - 1 positives j of anchor i) gives (N_yi - 1)/N_yl.

Which pairs a batch holds (B in eq. 23):
- design "group": the batch is the (m,n)-group design's m*n images and the loss runs over all
  B = mn(mn - 1) ordered pairs i != j (each is distributed as Q of eq. 9).
- design "random": the batch is a list of 2P images whose consecutive entries (2k, 2k+1) are the
  P pairs the p-random design drew (nearsight/training/samplers/random_pairs.py). Only those pairs enter
  the loss (cross pairs (2k, 2l+1) are not distributed as Q), each in both orders, so
  B = 2P ordered pairs, like the paper's 4032 images for 2016 pairs. Q (eq. 8) is symmetric,
  so both orders are draws from Q and the estimate stays unbiased; averaging them only
  symmetrises eta.
The weights are right only if the batches come from the matching sampler, built on the same
images: pass ``class_counts=sampler.class_counts()`` and ``**sampler.design_params()``.

``lam=None`` gives the classic contrastive loss (eta = 1); ``importance=False`` sets W = 1.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from nearsight.training.losses._pairs import (
    DISTANCE_EPS,
    check_on_host,
    float32_loss,
    pairwise_distances,
    pairwise_squared_distances,
)
from nearsight.training.losses.registry import LossConfigError

DESIGNS = ("group", "random")


class BalancedContrastiveLoss(nn.Module):
    """Eq. 23 with eta of eq. 15 and W = P_U/Q of eqs. 24-25 (see the module docstring).

    Parameters: ``class_counts`` (label -> N_c over the training set the sampler draws from;
    needed unless ``lam=None`` and ``importance=False``), ``design`` ("group" with ``m`` images
    per class and ``n`` classes per batch, or "random" with ``p`` the share of positive
    pairs), ``margin`` alpha (1.0), ``lam`` lambda (256; None = classic contrastive),
    ``importance`` (True).
    """

    # buffers: the classes' labels, sorted, and their image counts
    count_labels: torch.Tensor
    count_sizes: torch.Tensor

    def __init__(
        self,
        class_counts: Mapping[int, int] | None = None,
        design: str = "group",
        m: int | None = None,
        n: int | None = None,
        p: float | None = None,
        margin: float = 1.0,
        lam: float | None = 256.0,
        importance: bool = True,
    ) -> None:
        super().__init__()
        if design not in DESIGNS:
            raise LossConfigError(
                f"bcontrastive: unknown design {design!r}; valid designs: {', '.join(DESIGNS)}"
            )
        if not margin > 0:
            raise LossConfigError(f"bcontrastive: margin must be > 0, got {margin}")
        if lam is not None and not lam > 0:
            raise LossConfigError(f"bcontrastive: lam must be > 0 (or None), got {lam}")
        self.design = design
        self.margin = float(margin)
        self.lam = None if lam is None else float(lam)
        self.importance = bool(importance)
        self.m, self.n, self.p = self._check_design(design, m, n, p)

        needs_counts = self.lam is not None or self.importance
        if class_counts is None:
            if needs_counts:
                raise LossConfigError(
                    "bcontrastive needs class_counts (label -> images per class of the training "
                    "set, e.g. sampler.class_counts()) unless lam=None and importance=False"
                )
            class_counts = {}
        counts = self._check_counts(class_counts, needs_counts)
        labels_sorted = sorted(counts)
        self.register_buffer(
            "count_labels", torch.tensor(labels_sorted, dtype=torch.long), persistent=False
        )
        self.register_buffer(
            "count_sizes",
            torch.tensor([counts[k] for k in labels_sorted], dtype=torch.float64),
            persistent=False,
        )
        self.num_classes = len(counts)  # L
        self.num_images = sum(counts.values())  # N

    # ------------------------------------------------------------------ validation
    def _check_design(
        self, design: str, m: int | None, n: int | None, p: float | None
    ) -> tuple[int | None, int | None, float | None]:
        if design == "group":
            if p is not None:
                raise LossConfigError("bcontrastive: p belongs to design='random', not 'group'")
            if self.importance and (m is None or n is None):
                raise LossConfigError(
                    "bcontrastive: design='group' with importance=True needs m (images per "
                    "class) and n (classes per batch)"
                )
            if (m is None) != (n is None):
                raise LossConfigError("bcontrastive: give both m and n, or neither")
            if m is not None and n is not None and (int(m) != m or int(n) != n or m < 2 or n < 2):
                raise LossConfigError(
                    f"bcontrastive: m and n must be integers >= 2, got m={m}, n={n}"
                )
            return (None, None, None) if m is None or n is None else (int(m), int(n), None)
        if m is not None or n is not None:
            raise LossConfigError("bcontrastive: m and n belong to design='group', not 'random'")
        if self.importance and p is None:
            raise LossConfigError(
                "bcontrastive: design='random' with importance=True needs p (share of "
                "positive pairs)"
            )
        if p is not None and not 0 < p < 1:
            raise LossConfigError(f"bcontrastive: p must lie strictly between 0 and 1, got {p}")
        return None, None, None if p is None else float(p)

    def _check_counts(self, class_counts: Mapping[int, int], needed: bool) -> dict[int, int]:
        try:
            counts = {int(k): int(v) for k, v in class_counts.items()}
        except (AttributeError, TypeError, ValueError):
            raise LossConfigError(
                "bcontrastive: class_counts must map integer labels to image counts"
            ) from None
        if any(v < 1 for v in counts.values()):
            raise LossConfigError("bcontrastive: every class in class_counts needs >= 1 image")
        if needed and len(counts) < 2:
            raise LossConfigError("bcontrastive: class_counts needs at least 2 classes")
        if not self.importance:
            return counts
        if self.design == "group":
            assert self.m is not None and self.n is not None, "_check_design: importance needs both"
            if self.n > len(counts):
                raise LossConfigError(
                    f"bcontrastive: n={self.n} classes per batch but class_counts has {len(counts)}"
                )
            small = sorted(k for k, v in counts.items() if v < self.m)
            minimum = self.m
        else:
            small = sorted(k for k, v in counts.items() if v < 2)
            minimum = 2
        if small:
            raise LossConfigError(
                f"bcontrastive: classes {small[:5]} have fewer than {minimum} images, so the "
                f"{self.design} design cannot draw them and its importance weights would be "
                "wrong; pass the sampler's class_counts(), which leaves them out"
            )
        return counts

    # ------------------------------------------------------------------ weights
    def class_sizes(self, labels: torch.Tensor) -> torch.Tensor:
        """N_y for each label (float64, same shape); labels missing from ``class_counts``
        raise :class:`LossConfigError`."""
        table = self.count_labels.to(labels.device)
        if table.numel() == 0:
            raise LossConfigError("bcontrastive: class_counts is empty")
        flat = labels.reshape(-1).to(torch.long).contiguous()
        position = torch.searchsorted(table, flat).clamp(max=table.numel() - 1)
        found = table[position] == flat
        if not check_on_host(flat):
            # no host sync inside a compiled or CUDA step: the device checks (and stops a run
            # whose sampler drew a class the weights do not know)
            torch._assert_async(found.all(), "bcontrastive: a label is not in class_counts")
        elif not bool(found.all()):
            missing = sorted(set(flat[~found].tolist()))
            raise LossConfigError(
                f"bcontrastive: labels {missing[:5]} are not in class_counts; build the loss "
                "with the class counts of the data the sampler draws from"
            )
        return self.count_sizes.to(labels.device)[position].reshape(labels.shape)

    def negative_weights(self, labels_i: torch.Tensor, labels_j: torch.Tensor) -> torch.Tensor:
        """eta_ij = lambda/(L-1) (N_yi - 1)/N_yj (eq. 15), broadcast over the two label
        tensors (float64); 1 for the classic contrastive loss (lam=None)."""
        if self.lam is None:
            shape = torch.broadcast_shapes(labels_i.shape, labels_j.shape)
            return torch.ones(shape, dtype=torch.float64, device=labels_i.device)
        return self._eta(self.class_sizes(labels_i), self.class_sizes(labels_j))

    def importance_weights(self, labels_i: torch.Tensor, labels_j: torch.Tensor) -> torch.Tensor:
        """W_ij = P_U(i,j) / Q(i,j) (eqs. 24-25) for the ordered pairs of labels (i, j),
        broadcast over the two label tensors (float64); 1 when ``importance=False``."""
        shape = torch.broadcast_shapes(labels_i.shape, labels_j.shape)
        if not self.importance:
            return torch.ones(shape, dtype=torch.float64, device=labels_i.device)
        same = labels_i == labels_j
        return self._w(same, self.class_sizes(labels_i), self.class_sizes(labels_j)).expand(shape)

    def _eta(self, size_i: torch.Tensor, size_j: torch.Tensor) -> torch.Tensor:
        assert self.lam is not None, "eta only for the balanced loss (lam set)"
        return self.lam / (self.num_classes - 1) * (size_i - 1.0) / size_j

    def _w(self, same: torch.Tensor, size_i: torch.Tensor, size_j: torch.Tensor) -> torch.Tensor:
        classes, images = float(self.num_classes), float(self.num_images)
        pairs = images * (images - 1.0)  # 1 / P_U
        if self.design == "group":
            assert self.m is not None and self.n is not None, "_check_design: importance needs both"
            m, n = float(self.m), float(self.n)
            positive = classes * (m * n - 1) * size_i * (size_i - 1) / ((m - 1) * pairs)
            negative = (
                classes * (classes - 1) * (m * n - 1) * size_i * size_j / (m * (n - 1) * pairs)
            )
        else:
            p = self.p
            assert p is not None, "_check_design: importance needs p"
            positive = classes * size_i * (size_i - 1) / (p * pairs)
            negative = classes * (classes - 1) * size_i * size_j / ((1 - p) * pairs)
        return torch.where(same, positive, negative)

    # ------------------------------------------------------------------ loss
    def _pair_terms(
        self,
        squared: torch.Tensor,
        distances: torch.Tensor,
        same: torch.Tensor,
        size_i: torch.Tensor | None,
        size_j: torch.Tensor | None,
    ) -> torch.Tensor:
        """W [Y g + (1 - Y) eta h] for aligned pair tensors (sizes None when unused)."""
        hinge = (self.margin - distances).clamp(min=0.0)
        negative = hinge * hinge
        if self.lam is not None:
            assert size_i is not None and size_j is not None, "_sizes_if_needed: lam needs them"
            negative = self._eta(size_i, size_j).to(distances.dtype) * negative
        terms = torch.where(same, squared, negative)
        if self.importance:
            assert size_i is not None and size_j is not None, "_sizes_if_needed: W needs them"
            terms = self._w(same, size_i, size_j).to(distances.dtype) * terms
        return terms

    @float32_loss
    def forward(self, emb: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        labels = labels.to(emb.device).reshape(-1)
        size = emb.shape[0]
        if self.design == "group":
            if self.m is not None and self.n is not None and size != self.m * self.n:
                raise LossConfigError(
                    f"bcontrastive: design='group' with m={self.m}, n={self.n} expects batches "
                    f"of {self.m * self.n} embeddings, got {size}"
                )
            if size < 2:
                return emb.sum() * 0.0
            squared = pairwise_squared_distances(emb)
            distances = pairwise_distances(emb)
            sizes = self._sizes_if_needed(labels)
            same = labels[:, None] == labels[None, :]
            size_i = None if sizes is None else sizes[:, None]
            size_j = None if sizes is None else sizes[None, :]
            terms = self._pair_terms(squared, distances, same, size_i, size_j)
            off_diagonal = ~torch.eye(size, dtype=torch.bool, device=emb.device)
            return torch.where(off_diagonal, terms, torch.zeros_like(terms)).sum() / (
                size * (size - 1)
            )
        if size % 2:
            raise LossConfigError(
                "bcontrastive: design='random' expects an even batch of consecutive pairs "
                f"(2k, 2k+1), got {size} embeddings"
            )
        if size == 0:
            return emb.sum() * 0.0
        first, second = emb[0::2], emb[1::2]
        squared = ((first - second) ** 2).sum(dim=1)
        distances = squared.clamp(min=DISTANCE_EPS).sqrt()
        same = labels[0::2] == labels[1::2]
        sizes = self._sizes_if_needed(labels)
        size_first = None if sizes is None else sizes[0::2]
        size_second = None if sizes is None else sizes[1::2]
        # both orders of every drawn pair: B = 2P ordered pairs
        terms = self._pair_terms(squared, distances, same, size_first, size_second)
        terms = terms + self._pair_terms(squared, distances, same, size_second, size_first)
        return terms.sum() / size

    def _sizes_if_needed(self, labels: torch.Tensor) -> torch.Tensor | None:
        if self.lam is None and not self.importance:
            return None
        return self.class_sizes(labels)
