"""Batch samplers (nearsight/training/samplers/): seeded epochs, exact resume, batch structure, and the
acceptance test of the balanced-contrastive paper's batch designs: the empirical frequency of
every ordered pair matches Q of eqs. 8-9, and W = P_U / Q makes the loss an unbiased estimate
of the uniform-pair mean."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from nearsight.training.losses import build_loss
from nearsight.training.samplers import (
    SAMPLERS,
    GroupBatchSampler,
    MPerClassSampler,
    RandomPairBatchSampler,
    SamplerConfigError,
    build_sampler,
)

SIZES = [3, 4, 5, 6, 7, 8]  # six classes of unequal sizes
LABELS = np.repeat(np.arange(len(SIZES)), SIZES)
rng = np.random.default_rng(0)
SHUFFLED = rng.permutation(LABELS)  # samplers must not rely on sorted labels


def make(name: str, labels=SHUFFLED, seed: int = 0):
    params = {
        "group": {"m": 3, "n": 4},
        "random": {"batch_pairs": 5, "p": 0.5},
        "m_per_class": {"m": 2, "batch_size": 8},
    }[name]
    return build_sampler(name, labels, seed=seed, **params)


def epoch(sampler, number: int, start: int = 0) -> list[list[int]]:
    sampler.set_epoch(number, start_batch=start)
    return list(sampler)


# ---------------------------------------------------------------- determinism and resume


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_batches_depend_only_on_seed_and_epoch(name: str) -> None:
    first, second = make(name), make(name)
    assert epoch(first, 3) == epoch(second, 3)
    assert epoch(first, 3) == epoch(first, 3)  # iterating again repeats the epoch
    assert epoch(first, 3) != epoch(first, 4)
    assert epoch(make(name, seed=1), 3) != epoch(first, 3)


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_start_batch_yields_the_tail_of_the_epoch(name: str) -> None:
    sampler = make(name)
    full = epoch(sampler, 2)
    assert len(full) == len(sampler) >= 2
    for k in range(len(full) + 1):
        assert epoch(make(name), 2, start=k) == full[k:]
    with pytest.raises(SamplerConfigError, match="past the end"):
        sampler.set_epoch(2, start_batch=len(sampler) + 1)
    with pytest.raises(SamplerConfigError):
        sampler.set_epoch(-1)


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_batch_sizes_and_dataloader(name: str) -> None:
    sampler = make(name)
    batches = epoch(sampler, 0)
    assert all(len(batch) == sampler.batch_size for batch in batches)
    dataset = TensorDataset(torch.tensor(SHUFFLED))
    sampler.set_epoch(0)
    loaded = [labels.tolist() for (labels,) in DataLoader(dataset, batch_sampler=sampler)]
    assert loaded == [[int(SHUFFLED[i]) for i in batch] for batch in batches]


# ---------------------------------------------------------------- batch structure


@pytest.mark.parametrize("name", ["group", "m_per_class"])
def test_every_class_is_seen_each_epoch(name: str) -> None:
    sampler = make(name)
    for number in range(5):
        seen = {int(SHUFFLED[i]) for batch in epoch(sampler, number) for i in batch}
        assert seen == set(range(len(SIZES)))


def test_group_batches_are_n_classes_of_m_distinct_images() -> None:
    sampler = GroupBatchSampler(SHUFFLED, m=3, n=4, seed=5)
    # 6 classes in groups of 4: 2 batches per pass, the second filled up from the other classes
    assert len(sampler) == sampler.passes * 2 and sampler.passes == round(33 / 18)
    for batch in epoch(sampler, 0):
        assert len(set(batch)) == 12
        labels = SHUFFLED[batch]
        classes, counts = np.unique(labels, return_counts=True)
        assert len(classes) == 4 and (counts == 3).all()
        # listed class by class
        assert all(len(set(labels[k : k + 3])) == 1 for k in range(0, 12, 3))


def test_m_per_class_batches_and_small_classes_with_replacement() -> None:
    labels = np.repeat(np.arange(5), [1, 2, 5, 6, 9])
    sampler = MPerClassSampler(labels, m=3, batch_size=9, seed=0, passes=4)
    assert len(sampler) == 4 * 2 and sampler.class_counts() == {0: 1, 1: 2, 2: 5, 3: 6, 4: 9}
    for batch in epoch(sampler, 1):
        batch_labels = labels[batch]
        classes, counts = np.unique(batch_labels, return_counts=True)
        assert len(classes) == 3 and (counts == 3).all()
        for c in classes:  # without replacement wherever the class is big enough
            members = [i for i in batch if labels[i] == c]
            assert len(set(members)) == min(3, int((labels == c).sum()))
    with pytest.raises(SamplerConfigError, match="group"):
        sampler.design_params()
    full = MPerClassSampler(LABELS, m=3, batch_size=12)
    assert full.design_params() == {"design": "group", "m": 3, "n": 4}


def test_random_pairs_are_consecutive_positive_or_negative_pairs() -> None:
    sampler = RandomPairBatchSampler(SHUFFLED, batch_pairs=50, p=0.3, seed=2)
    assert len(sampler) == 1 and sampler.batch_size == 100  # ceil(33 / 100)
    pairs = np.array(epoch(sampler, 0)[0]).reshape(-1, 2)
    assert (pairs[:, 0] != pairs[:, 1]).all()
    positive = SHUFFLED[pairs[:, 0]] == SHUFFLED[pairs[:, 1]]
    assert 0 < positive.sum() < len(pairs)
    assert RandomPairBatchSampler(SHUFFLED, 4, 0.5, batches_per_epoch=7).__len__() == 7


def test_classes_too_small_for_the_design_are_left_out_with_a_warning() -> None:
    labels = np.repeat(np.arange(5), [2, 3, 4, 5, 1])
    with pytest.warns(UserWarning, match="leaving out 2 class"):
        group = GroupBatchSampler(labels, m=3, n=2, seed=0, passes=20)
    assert group.class_counts() == {1: 3, 2: 4, 3: 5}
    drawn = {int(labels[i]) for batch in epoch(group, 0) for i in batch}
    assert drawn == {1, 2, 3}
    with pytest.warns(UserWarning, match="leaving out 1 class"):
        pairs = RandomPairBatchSampler(labels, batch_pairs=200, p=0.5, seed=0)
    assert pairs.class_counts() == {0: 2, 1: 3, 2: 4, 3: 5}
    assert 4 not in {int(labels[i]) for batch in epoch(pairs, 0) for i in batch}
    # the counts feed the loss, which then accepts the design
    loss = build_loss("bcontrastive", class_counts=group.class_counts(), **group.design_params())
    assert loss.num_classes == 3 and loss.num_images == 12
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GroupBatchSampler(LABELS, m=3, n=4)  # nothing to leave out: no warning


# ---------------------------------------------------------------- configuration


def test_build_sampler_errors() -> None:
    with pytest.raises(SamplerConfigError, match="unknown sampler 'pk'"):
        build_sampler("pk", LABELS)
    with pytest.raises(SamplerConfigError, match="no parameter 'k'"):
        build_sampler("group", LABELS, m=3, n=4, k=2)
    with pytest.raises(SamplerConfigError, match="needs parameter"):
        build_sampler("group", LABELS, m=3)
    with pytest.raises(SamplerConfigError, match="m must be"):
        build_sampler("group", LABELS, m=1, n=4)
    with pytest.raises(SamplerConfigError, match="only 4 class"), pytest.warns(UserWarning):
        build_sampler("group", LABELS, m=5, n=5)
    with pytest.raises(SamplerConfigError, match="strictly between"):
        build_sampler("random", LABELS, batch_pairs=4, p=1.0)
    with pytest.raises(SamplerConfigError, match="multiple of m"):
        build_sampler("m_per_class", LABELS, m=3, batch_size=10)
    with pytest.raises(SamplerConfigError, match="only 6 classes"):
        build_sampler("m_per_class", LABELS, m=2, batch_size=16)
    with pytest.raises(SamplerConfigError, match="integers"):
        build_sampler("group", [0.5, 1.5, 1.0], m=2, n=2)
    assert issubclass(SamplerConfigError, ValueError)


def test_labels_may_be_a_tensor_or_a_list() -> None:
    from_tensor = GroupBatchSampler(torch.tensor(SHUFFLED), m=3, n=4, seed=1)
    from_list = GroupBatchSampler(SHUFFLED.tolist(), m=3, n=4, seed=1)
    assert epoch(from_tensor, 0) == epoch(from_list, 0)
    assert from_list.class_counts() == dict(enumerate(SIZES))
    assert from_list.design_params() == {"design": "group", "m": 3, "n": 4}


# ---------------------------------------------------------------- acceptance: Q of eqs. 8-9


def q_group(labels: np.ndarray, m: int, n: int) -> np.ndarray:
    """Eq. 9 of the paper, for every ordered pair (i, j) of the dataset (diagonal 0)."""
    classes, sizes = np.unique(labels, return_counts=True)
    size = sizes[np.searchsorted(classes, labels)].astype(float)
    L = len(classes)
    same = labels[:, None] == labels[None, :]
    positive = (m - 1) / (L * (m * n - 1) * size[:, None] * (size[:, None] - 1))
    negative = m * (n - 1) / (L * (L - 1) * (m * n - 1) * size[:, None] * size[None, :])
    q = np.where(same, positive, negative)
    np.fill_diagonal(q, 0.0)
    return q


def q_random(labels: np.ndarray, p: float) -> np.ndarray:
    """Eq. 8 of the paper, for every ordered pair (i, j) of the dataset (diagonal 0)."""
    classes, sizes = np.unique(labels, return_counts=True)
    size = sizes[np.searchsorted(classes, labels)].astype(float)
    L = len(classes)
    same = labels[:, None] == labels[None, :]
    positive = p / (L * size[:, None] * (size[:, None] - 1))
    negative = (1 - p) / (L * (L - 1) * size[:, None] * size[None, :])
    q = np.where(same, positive, negative)
    np.fill_diagonal(q, 0.0)
    return q


def all_pair_counts(batches: np.ndarray, total: int, chunk: int = 20_000) -> np.ndarray:
    """[total, total] counts of every ordered pair (i, j), i != j position, over all batches."""
    size = batches.shape[1]
    off_diagonal = ~np.eye(size, dtype=bool)
    counts = np.zeros(total * total, dtype=np.int64)
    for start in range(0, len(batches), chunk):
        part = batches[start : start + chunk]
        flat = part[:, :, None] * total + part[:, None, :]
        counts += np.bincount(flat[:, off_diagonal].ravel(), minlength=total * total)
    return counts.reshape(total, total)


def drawn_pair_counts(batches: np.ndarray, total: int) -> np.ndarray:
    """[total, total] counts of the drawn ordered pairs (2k, 2k+1) of random-design batches."""
    pairs = batches.reshape(-1, 2)
    counts = np.zeros((total, total), dtype=np.int64)
    np.add.at(counts, (pairs[:, 0], pairs[:, 1]), 1)
    return counts


@pytest.mark.parametrize(
    ("sizes", "m", "n", "passes"),
    [
        (SIZES, 3, 4, 63_000),  # 6 classes in groups of 4: every second batch is filled up
        ([2, 3, 3, 4, 5], 2, 5, 82_000),  # n = L: every class in every batch
    ],
)
def test_group_design_pair_frequencies_match_eq_9(sizes, m, n, passes) -> None:
    labels = np.random.default_rng(1).permutation(np.repeat(np.arange(len(sizes)), sizes))
    sampler = GroupBatchSampler(labels, m=m, n=n, seed=3, passes=passes)
    batches = sampler.epoch_batches()
    counts = all_pair_counts(batches, len(labels))
    frequency = counts / (len(batches) * m * n * (m * n - 1))
    q = q_group(labels, m, n)
    assert q.sum() == pytest.approx(1.0)
    off = ~np.eye(len(labels), dtype=bool)
    # the sample is sized so that 5% is >= 4.5 standard deviations for the rarest pair
    assert counts[off].min() > 7000
    np.testing.assert_allclose(frequency[off], q[off], rtol=0.05)
    assert np.abs(frequency[off] / q[off] - 1).mean() < 0.01
    assert counts[~off].sum() == 0


def test_random_design_pair_frequencies_match_eq_8() -> None:
    sizes, p = [2, 3, 3, 4, 5], 0.2
    labels = np.random.default_rng(2).permutation(np.repeat(np.arange(len(sizes)), sizes))
    sampler = RandomPairBatchSampler(labels, batch_pairs=5000, p=p, seed=4, batches_per_epoch=900)
    counts = drawn_pair_counts(sampler.epoch_batches(), len(labels))
    frequency = counts / (900 * 5000)
    q = q_random(labels, p)
    assert q.sum() == pytest.approx(1.0)
    off = ~np.eye(len(labels), dtype=bool)
    assert counts[off].min() > 7000
    np.testing.assert_allclose(frequency[off], q[off], rtol=0.05)
    assert np.abs(frequency[off] / q[off] - 1).mean() < 0.01
    assert counts[~off].sum() == 0


# ---------------------------------------------------------------- acceptance: unbiased loss


def uniform_pair_mean(emb: torch.Tensor, labels: np.ndarray, margin: float, lam: float) -> float:
    """The balanced contrastive loss averaged uniformly over all ordered pairs of the data
    (eq. 10 / N(N-1)), pair by pair."""
    classes, sizes = np.unique(labels, return_counts=True)
    count = dict(zip(classes.tolist(), sizes.tolist(), strict=True))
    total = 0.0
    for i in range(len(labels)):
        for j in range(len(labels)):
            if i == j:
                continue
            d = float(torch.linalg.norm(emb[i] - emb[j]))
            if labels[i] == labels[j]:
                total += d * d
            else:
                eta = lam / (len(classes) - 1) * (count[labels[i]] - 1) / count[labels[j]]
                total += eta * max(0.0, margin - d) ** 2
    return total / (len(labels) * (len(labels) - 1))


@pytest.mark.parametrize(
    ("name", "params"),
    [("group", {"m": 3, "n": 4}), ("random", {"batch_pairs": 30, "p": 0.3})],
)
def test_importance_weighted_loss_is_unbiased_for_the_uniform_pair_mean(name, params) -> None:
    labels = SHUFFLED
    # class clusters whose spread shrinks with class size: pair values correlate with Q / P_U,
    # so dropping the weights visibly biases the mean
    generator = torch.Generator().manual_seed(0)
    centers = torch.randn(len(SIZES), 3, generator=generator, dtype=torch.float64)
    spread = torch.tensor([1.5 / (s - 2) for s in SIZES], dtype=torch.float64)
    noise = torch.randn(len(labels), 3, generator=generator, dtype=torch.float64)
    labels_t = torch.tensor(labels)
    emb = torch.nn.functional.normalize(centers[labels_t] + spread[labels_t, None] * noise, dim=1)
    margin, lam = 1.2, 4.0
    target = uniform_pair_mean(emb, labels, margin, lam)

    sampler = build_sampler(name, labels, seed=0, **params)
    weighted = build_loss(
        "bcontrastive", class_counts=sampler.class_counts(), margin=margin, lam=lam,
        **sampler.design_params(),
    )  # fmt: skip
    unweighted = build_loss(
        "bcontrastive", class_counts=sampler.class_counts(), margin=margin, lam=lam,
        importance=False, **sampler.design_params(),
    )  # fmt: skip
    values, plain = [], []
    number = 0
    while len(values) < 2000:
        for batch in epoch(sampler, number):
            values.append(float(weighted(emb[batch], labels_t[batch])))
            plain.append(float(unweighted(emb[batch], labels_t[batch])))
        number += 1
    estimate = float(np.mean(values))
    standard_error = float(np.std(values) / np.sqrt(len(values)))
    assert standard_error < 0.01 * target  # so that 3% is a safe margin
    assert estimate == pytest.approx(target, rel=0.03)
    # without the weights the same batches are biased: the test can tell the difference
    assert abs(float(np.mean(plain)) / target - 1) > 0.1
