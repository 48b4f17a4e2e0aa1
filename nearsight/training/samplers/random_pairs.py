"""The p-random pair design of Hong, Park and Kim, "Deep Metric Learning via Weighted
Contrastive Loss", section 4.1 ("balanced random batch design"): every pair is positive with
probability p; a positive pair is a class drawn uniformly from the L classes and an ordered
pair of two distinct images of it drawn uniformly; a negative pair is an ordered pair of two
distinct classes drawn uniformly and one image of each drawn uniformly. Its pair distribution
Q is eq. 8; the balanced contrastive loss corrects it with W = P_U / Q (eq. 24).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np

from nearsight.training.samplers._base import (
    ClassIndex,
    SamplerConfigError,
    SeededBatchSampler,
    check_int,
    uniform_below,
)


class RandomPairBatchSampler(SeededBatchSampler):
    """Batches of ``batch_pairs`` independent draws of the p-random design.

    A batch is a list of 2 * batch_pairs dataset indices in which entries (2k, 2k+1) are the
    k-th drawn ordered pair; the same image may appear in several pairs. The loss must use
    exactly these pairs (bcontrastive with ``design="random"`` does: only the consecutive pairs,
    each in both orders, B = 2 * batch_pairs), not all pairs of the batch.

    An epoch is ``batches_per_epoch`` batches, by default ceil(N / (2 batch_pairs)) (about as
    many images as the data has); every class is expected, not guaranteed, to be drawn.

    Classes with fewer than 2 images are left out, with a warning: a positive pair picks its
    class uniformly among all L classes and needs two distinct images of it, so eq. 8 only
    holds if every class has two. ``class_counts()`` reports only the kept classes, so the
    loss's L, N and N_c describe exactly the data sampled.
    """

    def __init__(
        self,
        labels: Sequence[int],
        batch_pairs: int,
        p: float,
        seed: int = 0,
        batches_per_epoch: int | None = None,
    ) -> None:
        super().__init__(labels, seed)
        self.batch_pairs = check_int("batch_pairs", batch_pairs, 1)
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p < 1:
            raise SamplerConfigError(
                f"random-pair sampler: p must lie strictly between 0 and 1, got {p!r}"
            )
        self.p = float(p)
        classes, counts = np.unique(self.labels, return_counts=True)
        keep = counts >= 2
        if not keep.all():
            dropped = classes[~keep]
            warnings.warn(
                f"random-pair sampler: leaving out {len(dropped)} class(es) with a single image "
                f"(e.g. {dropped[:5].tolist()}); they cannot form a positive pair",
                stacklevel=2,
            )
        if keep.sum() < 2:
            raise SamplerConfigError(
                "random-pair sampler needs at least 2 classes with 2 or more images, "
                f"found {int(keep.sum())}"
            )
        self.index = ClassIndex(self.labels, keep)
        if batches_per_epoch is None:
            batches_per_epoch = math.ceil(int(self.index.sizes.sum()) / self.batch_size)
        self.batches_per_epoch = check_int("batches_per_epoch", batches_per_epoch, 1)

    def __len__(self) -> int:
        return self.batches_per_epoch

    @property
    def batch_size(self) -> int:
        return 2 * self.batch_pairs

    def class_counts(self) -> dict[int, int]:
        return self.index.counts()

    def design_params(self) -> dict[str, object]:
        return {"design": "random", "p": self.p}

    def _draw_epoch(self, rng: np.random.Generator) -> np.ndarray:
        draws = self.batches_per_epoch * self.batch_pairs
        num_classes, sizes = len(self.index), self.index.sizes
        positive = rng.random(draws) < self.p
        # positive: one class, two distinct images of it (the second skips the first)
        cls = rng.integers(0, num_classes, draws)
        pos_first = uniform_below(rng, sizes[cls])
        pos_second = uniform_below(rng, sizes[cls] - 1)
        pos_second += pos_second >= pos_first
        # negative: two distinct classes (the second skips the first), one image of each
        cls_first = rng.integers(0, num_classes, draws)
        cls_second = rng.integers(0, num_classes - 1, draws)
        cls_second += cls_second >= cls_first
        neg_first = uniform_below(rng, sizes[cls_first])
        neg_second = uniform_below(rng, sizes[cls_second])
        first = np.where(
            positive,
            self.index.to_dataset(cls, pos_first),
            self.index.to_dataset(cls_first, neg_first),
        )
        second = np.where(
            positive,
            self.index.to_dataset(cls, pos_second),
            self.index.to_dataset(cls_second, neg_second),
        )
        return np.stack([first, second], axis=1).reshape(self.batches_per_epoch, self.batch_size)
