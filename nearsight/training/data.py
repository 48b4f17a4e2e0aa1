"""Training data: the validation hold-out and the papers' augmentation, reproducible per image.

Augmentation randomness is seeded per (run seed, epoch, batch, position) instead of per
DataLoader worker, so a run resumed from ``last.pt`` sees exactly the pixels the uninterrupted
run would have seen, whatever the number of workers.

``data.val_classes`` holds whole classes out of the training split (class-disjoint, like the
test split, and drawn with the run's seed), so a checkpoint can be chosen on classes the
network did not train on without looking at the test classes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from nearsight.core.errors import NearsightError
from nearsight.data.datasets import DatasetSplit, Sample
from nearsight.data.images import ImageLoadError, MinSide, load_image_pixels
from nearsight.training.augment import RandomCropDecode

log = logging.getLogger(__name__)


def hold_out_classes(
    train: DatasetSplit, val_classes: float, seed: int
) -> tuple[DatasetSplit, DatasetSplit | None]:
    """Split ``train`` class-disjointly into (train, validation). ``val_classes`` is a number
    of classes, or a share of them when below 1 (at least one class); 0 holds out nothing."""
    if not val_classes:
        return train, None
    classes = sorted(set(train.require_labels()))
    count = round(val_classes * len(classes)) if val_classes < 1 else int(val_classes)
    count = max(1, count)
    if count > len(classes) - 2:
        raise NearsightError(
            f"data.val_classes {val_classes:g} leaves fewer than 2 of the {len(classes)} "
            "training classes to train on"
        )
    order = np.random.default_rng([seed, 0x7661]).permutation(len(classes))
    held = {classes[i] for i in order[:count]}
    keep = [s for s in train.samples if s.label not in held]
    val = [s for s in train.samples if s.label in held]
    return (
        DatasetSplit(train.name, train.root, "train", keep),
        DatasetSplit(train.name, train.root, "val", val),
    )


SMALLEST_CROP_RATIO = 3 / 4  # RandomResizedCrop's default aspect ratios: 3/4 to 4/3


def train_min_side(image_size: int, crop_scale: Sequence[float]):
    """The short side a training image must keep so that RandomResizedCrop's smallest crop
    (``crop_scale[0]`` of the area, at the narrowest aspect ratio) still has ``image_size``
    pixels across: what an image decoded once for every later crop (``data.cache_images``)
    keeps. A function of the image's width and height."""

    def min_side(width: int, height: int) -> int:
        short, long = min(width, height), max(width, height)
        smallest_crop = math.sqrt(crop_scale[0] * short * long * SMALLEST_CROP_RATIO)
        return math.ceil(short * image_size / smallest_crop)

    return min_side


class SeededTrainDataset(Dataset):
    """Items are ``(sample_index, augmentation_seed)`` pairs from :class:`SeededBatches`.

    An image that cannot be read is reported once (with its path) and replaced by the next
    image of the same class, so a long job never dies of one bad file.
    """

    def __init__(
        self,
        samples: Sequence[Sample],
        image_size: int,
        crop_scale,
        flip: bool,
        *,
        cache: bool = False,
        interpolation: str = "bilinear",
    ):
        self.samples = list(samples)
        self.transform = RandomCropDecode(image_size, crop_scale, flip, interpolation)
        self.min_side = train_min_side(image_size, crop_scale)
        self.labels: list[int] = []
        by_class: dict[int, list[int]] = {}
        for i, sample in enumerate(self.samples):
            # training samples come from a split that passed DatasetSplit.require_labels
            assert sample.label is not None, f"unlabelled training image {sample.path}"
            self.labels.append(sample.label)
            by_class.setdefault(sample.label, []).append(i)
        self._same_class = by_class
        self._reported: set[int] = set()
        # decoded once, before the DataLoader forks its workers (which then share the pages)
        self._cache: list[np.ndarray] | None = None
        if cache:
            self._cache = [self._decode(i, self.min_side) for i in range(len(self.samples))]

    def __len__(self) -> int:
        return len(self.samples)

    def _load(self, index: int, min_side: MinSide) -> np.ndarray:
        if self._cache is not None:
            return self._cache[index]
        return self._decode(index, min_side)

    def _decode(self, index: int, min_side: MinSide) -> np.ndarray:
        label = self.labels[index]
        members = self._same_class[label]
        start = members.index(index)
        for offset in range(len(members)):
            candidate = members[(start + offset) % len(members)]
            try:
                return load_image_pixels(self.samples[candidate].path, min_side)
            except ImageLoadError as error:
                if candidate not in self._reported:
                    self._reported.add(candidate)
                    log.warning("skipping unreadable training image: %s", error)
        raise ImageLoadError(
            f"no readable image in class {label} ({self.samples[index].class_name})"
        )

    def __getitem__(self, item: tuple[int, int]) -> tuple[torch.Tensor, int]:
        """The augmented image as uint8 [3, S, S] (:mod:`nearsight.training.augment`)."""
        index, seed = item
        with torch.random.fork_rng(devices=[]):
            # the CPU generator only: torch.manual_seed also seeds every accelerator backend,
            # each recording a stack trace while uninitialised (most of a small image's cost)
            torch.default_generator.manual_seed(seed)
            tensor = self.transform(lambda min_side: self._load(index, min_side))
        return tensor, self.labels[index]


class SeededBatches(Sampler[list[tuple[int, int]]]):
    """Wraps a batch sampler: each index gets an augmentation seed from its draw position."""

    def __init__(self, batch_sampler, seed: int):
        self.batch_sampler = batch_sampler
        self.seed = seed
        self.epoch = 0
        self.start_batch = 0

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.epoch, self.start_batch = epoch, start_batch
        self.batch_sampler.set_epoch(epoch, start_batch=start_batch)

    def __len__(self) -> int:
        return len(self.batch_sampler) - self.start_batch

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        for offset, batch in enumerate(self.batch_sampler):
            batch_index = self.start_batch + offset
            seeds = np.random.SeedSequence([self.seed, self.epoch, batch_index]).generate_state(
                len(batch), dtype=np.uint32
            )
            yield [(int(i), int(s)) for i, s in zip(batch, seeds, strict=True)]


def collate(batch: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images [B, 3, S, S] and their labels (:func:`to_unit_range` on the device)."""
    images = torch.stack([x for x, _ in batch])
    labels = torch.tensor([y for _, y in batch], dtype=torch.long)
    return images, labels


def to_unit_range(images: torch.Tensor, channels_last: bool = False) -> torch.Tensor:
    """A batch of uint8 images as float32 in [0, 1] (the model's input), in channels_last
    memory where the step runs in it."""
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    return images.to(torch.float32, memory_format=memory_format).div_(255.0)
