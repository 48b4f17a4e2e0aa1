"""m images per class, batch_size / m classes per batch: the usual batch of the ranking losses
(RankMI samples m images per class, ICE, RLL, NRA and the pytorch-metric-learning baselines use
P x K batches). Like pytorch-metric-learning's MPerClassSampler, but seeded per epoch,
resumable, and with every class seen each epoch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nearsight.training.samplers._base import (
    ClassGroupSampler,
    ClassIndex,
    SamplerConfigError,
    check_int,
    class_groups,
    draw_without_replacement,
    uniform_below,
)


class MPerClassSampler(ClassGroupSampler):
    """Batches of ``batch_size // m`` distinct classes with ``m`` images each, class by class.

    An epoch is ``passes`` random permutations of all classes cut into groups (the last group
    filled up with other classes, so every batch is full and every class is seen each epoch);
    ``passes`` defaults to round(N / (L m)), about one pass over the images per epoch. Images
    are drawn without replacement inside a class; a class with fewer than m images is drawn
    with replacement (as pytorch-metric-learning does), so it still fills its m slots.
    """

    def __init__(
        self,
        labels: Sequence[int],
        m: int,
        batch_size: int,
        seed: int = 0,
        passes: int | None = None,
    ) -> None:
        super().__init__(labels, seed)
        self.m = check_int("m", m, 1)
        size = check_int("batch_size", batch_size, 2)
        if size % self.m:
            raise SamplerConfigError(
                f"m-per-class sampler: batch_size {size} is not a multiple of m={self.m}"
            )
        self.n = size // self.m
        if self.n < 2:
            raise SamplerConfigError(
                f"m-per-class sampler: batch_size {size} with m={self.m} holds a single class; "
                "a batch needs at least 2 classes for negative pairs (raise --classes-per-batch)"
            )
        self.index = ClassIndex(self.labels)
        if len(self.index) < self.n:
            raise SamplerConfigError(
                f"m-per-class sampler: {self.n} classes per batch, but the labels have only "
                f"{len(self.index)} classes: lower --classes-per-batch "
                f"(sampler.classes_per_batch) to {len(self.index)} or fewer"
            )
        self._set_passes(passes)

    def design_params(self) -> dict[str, object]:
        """These batches are the (m,n)-group design when every class has at least m images
        (m >= 2); otherwise the importance weights would be wrong and this raises."""
        if self.m < 2 or int(self.index.sizes.min()) < self.m:
            raise SamplerConfigError(
                "m-per-class sampler draws classes with fewer than m images with replacement, "
                "which is not the (m,n)-group design; use the 'group' sampler for bcontrastive"
            )
        return {"design": "group", "m": self.m, "n": self.n}

    def _draw_epoch(self, rng: np.random.Generator) -> np.ndarray:
        groups = class_groups(rng, len(self.index), self.n, self.passes)
        slots = groups.reshape(-1)
        sizes = self.index.sizes[slots]
        small = sizes < self.m
        local = np.empty((len(slots), self.m), dtype=np.int64)
        local[~small] = draw_without_replacement(rng, sizes[~small], self.m)
        local[small] = uniform_below(rng, np.repeat(sizes[small][:, None], self.m, axis=1))
        images = self.index.to_dataset(slots[:, None], local)
        return images.reshape(len(groups), self.m * self.n)
