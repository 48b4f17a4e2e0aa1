"""What the batch samplers share: label bookkeeping, seeded epochs, exact resume, and the
vectorised draws (class groups, subsets without replacement) they are made of."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
from torch.utils.data import Sampler

from nearsight.core.errors import NearsightError


class SamplerConfigError(NearsightError, ValueError):
    """An unknown sampler name or a parameter the labels cannot satisfy."""


def as_label_array(labels: Sequence[int]) -> np.ndarray:
    """``labels`` as a 1-D int64 array; anything else raises :class:`SamplerConfigError`."""
    array = np.asarray(labels)
    if array.ndim != 1 or array.size == 0:
        raise SamplerConfigError(
            f"sampler labels must be a non-empty 1-D sequence, got {array.shape}"
        )
    if array.dtype.kind == "f" and np.all(array == np.round(array)):
        array = array.astype(np.int64)
    if array.dtype.kind not in "iu":
        raise SamplerConfigError(f"sampler labels must be integers, got dtype {array.dtype}")
    return array.astype(np.int64)


def check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise SamplerConfigError(
            f"sampler parameter {name} must be an integer >= {minimum}, got {value!r}"
        )
    return int(value)


class ClassIndex:
    """The images of each kept class: ``classes[c]`` is the label of class position c,
    ``sizes[c]`` its number of images, and ``to_dataset(c, k)`` the dataset index of its k-th
    image."""

    def __init__(self, labels: np.ndarray, keep: np.ndarray | None = None) -> None:
        classes, counts = np.unique(labels, return_counts=True)
        if keep is not None:
            classes, counts = classes[keep], counts[keep]
        self.classes = classes
        self.sizes = counts.astype(np.int64)
        member = np.isin(labels, classes)
        positions = np.flatnonzero(member)
        self.order = positions[np.argsort(labels[positions], kind="stable")]
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)

    def __len__(self) -> int:
        return len(self.classes)

    def to_dataset(self, class_position: np.ndarray, local: np.ndarray) -> np.ndarray:
        return self.order[self.offsets[class_position] + local]

    def counts(self) -> dict[int, int]:
        return {int(c): int(s) for c, s in zip(self.classes, self.sizes, strict=True)}


def class_groups(rng: np.random.Generator, num_classes: int, n: int, passes: int) -> np.ndarray:
    """[passes * ceil(L/n), n] class positions: each pass is a uniformly random permutation of
    the L classes cut into groups of n; a last incomplete group of r classes is filled with
    n - r classes drawn uniformly without replacement from the other L - r. Every group is then
    marginally a uniform n-subset of the classes (a uniform r-subset joined with a uniform
    (n-r)-subset of its complement), which is what the group design's Q assumes."""
    permutations = np.argsort(rng.random((passes, num_classes)), axis=1)
    full, rest = divmod(num_classes, n)
    groups = permutations[:, : full * n].reshape(passes, full, n)
    if rest:
        others = permutations[:, : full * n]  # the complement of the last `rest` classes
        fill_order = np.argsort(rng.random(others.shape), axis=1)[:, : n - rest]
        fill = np.take_along_axis(others, fill_order, axis=1)
        last = np.concatenate([permutations[:, full * n :], fill], axis=1)
        groups = np.concatenate([groups, last[:, None, :]], axis=1)
    return groups.reshape(-1, n)


def uniform_below(rng: np.random.Generator, high: np.ndarray) -> np.ndarray:
    """One uniform integer in [0, high[r]) per entry (high >= 1), vectorised; much faster than
    ``rng.integers`` with an array bound. The float64 draw has 53 bits, so the bias is
    far below anything a batch can see."""
    high = np.asarray(high, dtype=np.int64)
    return np.minimum((rng.random(high.shape) * high).astype(np.int64), high - 1)


def draw_without_replacement(rng: np.random.Generator, sizes: np.ndarray, m: int) -> np.ndarray:
    """[len(sizes), m] local indices: row r is a uniform m-subset of range(sizes[r]) (needs
    sizes >= m), by Floyd's algorithm vectorised over rows (memory O(rows * m), whatever the
    class sizes)."""
    out = np.empty((len(sizes), m), dtype=np.int64)
    for k in range(m):
        bound = sizes - m + k  # draw t in [0, bound]; bound itself is not taken yet
        t = uniform_below(rng, bound + 1)
        taken = (out[:, :k] == t[:, None]).any(axis=1)
        out[:, k] = np.where(taken, bound, t)
    return out


def default_passes(index: ClassIndex, m: int) -> int:
    """Class passes per epoch so that an epoch draws about as many images as the data has."""
    return max(1, round(int(index.sizes.sum()) / (len(index) * m)))


class SeededBatchSampler(Sampler[list[int]]):
    """A ``batch_sampler`` whose batches depend only on (seed, epoch).

    The trainer calls ``set_epoch(epoch)`` before each epoch (like DistributedSampler), and
    after loading ``last.pt`` calls ``set_epoch(epoch, start_batch=k)`` with the number k of
    batches of that epoch already consumed: iterating then yields exactly the remaining
    batches of the full epoch. ``len()`` is the number of batches of a full epoch.
    """

    def __init__(self, labels: Sequence[int], seed: int = 0) -> None:
        self.labels = as_label_array(labels)
        self.seed = check_int("seed", seed, 0)
        self.epoch = 0
        self.start_batch = 0

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        epoch = check_int("epoch", epoch, 0)
        start_batch = check_int("start_batch", start_batch, 0)
        if start_batch > len(self):
            raise SamplerConfigError(
                f"start_batch {start_batch} is past the end of an epoch of {len(self)} batches"
            )
        self.epoch, self.start_batch = epoch, start_batch

    def epoch_batches(self) -> np.ndarray:
        """[len(self), batch_size] dataset indices of the whole current epoch."""
        return self._draw_epoch(np.random.default_rng([self.seed, self.epoch]))

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.epoch_batches()[self.start_batch :]:
            yield batch.tolist()

    def __len__(self) -> int:
        raise NotImplementedError

    @property
    def batch_size(self) -> int:
        raise NotImplementedError

    def class_counts(self) -> dict[int, int]:
        """label -> number of images, for the classes this sampler draws from."""
        raise NotImplementedError

    def design_params(self) -> dict[str, object]:
        """The batch-design keywords of the bcontrastive loss for these batches."""
        raise NotImplementedError

    def _draw_epoch(self, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError


def groups_per_pass(num_classes: int, n: int) -> int:
    return math.ceil(num_classes / n)


class ClassGroupSampler(SeededBatchSampler):
    """Batches of n classes x m images whose epoch is ``passes`` random class permutations
    cut into groups of n (the group and m-per-class samplers). Subclasses set ``m``, ``n``
    and ``index`` and then call :meth:`_set_passes`."""

    m: int
    n: int
    index: ClassIndex
    passes: int

    def _set_passes(self, passes: int | None) -> None:
        self.passes = (
            default_passes(self.index, self.m) if passes is None else check_int("passes", passes, 1)
        )

    def __len__(self) -> int:
        return self.passes * groups_per_pass(len(self.index), self.n)

    @property
    def batch_size(self) -> int:
        return self.m * self.n

    def class_counts(self) -> dict[int, int]:
        return self.index.counts()
