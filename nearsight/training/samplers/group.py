"""The (m,n)-group batch design of Hong, Park and Kim, "Deep Metric Learning via Weighted
Contrastive Loss", section 4.2: n classes drawn uniformly without replacement, m images of each
drawn uniformly without replacement. Its pair distribution Q is eq. 9; the balanced contrastive
loss (nearsight/training/losses/bcontrastive.py) corrects it with W = P_U / Q (eq. 25).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from nearsight.training.samplers._base import (
    ClassGroupSampler,
    ClassIndex,
    SamplerConfigError,
    check_int,
    class_groups,
    draw_without_replacement,
)


class GroupBatchSampler(ClassGroupSampler):
    """Batches of the (m,n)-group design: ``n`` distinct classes, ``m`` distinct images each,
    listed class by class (batch size m*n).

    An epoch is ``passes`` random permutations of the classes, each cut into groups of n (so
    every class is seen every epoch); a last incomplete group is filled with classes drawn
    uniformly from the other classes of that permutation, so every batch has the design's size
    and its class set is, marginally, a uniform n-subset: Q of eq. 9 holds exactly for every
    batch. The m images are drawn afresh, uniformly without replacement, each time a class is
    drawn. ``passes`` defaults to round(N / (L m)), about one pass over the images per epoch.

    Classes with fewer than m images are left out, with a warning: the design cannot draw m
    distinct images from them, and drawing with replacement would put repeated images (i, i)
    into the batch and change Q, so the importance weights would be wrong. Leaving them out
    keeps eq. 9 exact for the images that are drawn; ``class_counts()`` reports only the kept
    classes, so the loss's L, N and N_c (hence P_U and W) describe exactly the data sampled.
    """

    def __init__(
        self,
        labels: Sequence[int],
        m: int,
        n: int,
        seed: int = 0,
        passes: int | None = None,
    ) -> None:
        super().__init__(labels, seed)
        self.m = check_int("m", m, 2)
        self.n = check_int("n", n, 2)
        classes, counts = np.unique(self.labels, return_counts=True)
        keep = counts >= self.m
        if not keep.all():
            dropped = classes[~keep]
            warnings.warn(
                f"group sampler: leaving out {len(dropped)} class(es) with fewer than m={self.m} "
                f"images (e.g. {dropped[:5].tolist()}); they cannot be drawn by the (m,n)-group "
                "design",
                stacklevel=2,
            )
        if keep.sum() < self.n:
            raise SamplerConfigError(
                f"group sampler: n={self.n} classes per batch, but only {int(keep.sum())} "
                f"class(es) have at least m={self.m} images: lower --classes-per-batch "
                "(sampler.classes_per_batch) or --per-class (sampler.per_class)"
            )
        self.index = ClassIndex(self.labels, keep)
        self._set_passes(passes)

    def design_params(self) -> dict[str, object]:
        return {"design": "group", "m": self.m, "n": self.n}

    def _draw_epoch(self, rng: np.random.Generator) -> np.ndarray:
        groups = class_groups(rng, len(self.index), self.n, self.passes)
        slots = groups.reshape(-1)
        local = draw_without_replacement(rng, self.index.sizes[slots], self.m)
        images = self.index.to_dataset(slots[:, None], local)
        return images.reshape(len(groups), self.m * self.n)
