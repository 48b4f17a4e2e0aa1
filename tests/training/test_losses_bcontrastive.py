"""Balanced contrastive loss with importance sampling (nearsight/training/losses/bcontrastive.py):
eq. 23 against a loop reference, eta of eq. 15, and W = P_U / Q against Q computed from the
batch designs' definitions (exact enumeration), not from the closed forms."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
import torch

from nearsight.training.losses import build_loss
from nearsight.training.losses.bcontrastive import BalancedContrastiveLoss
from nearsight.training.losses.registry import LossConfigError

COUNTS = {0: 3, 1: 4, 2: 5, 3: 6, 4: 7, 7: 8}  # unequal classes; label 7 leaves a gap


def reference_loss(
    emb: torch.Tensor,
    labels: list[int],
    counts: dict[int, int],
    design: str,
    m: int | None = None,
    n: int | None = None,
    p: float | None = None,
    margin: float = 1.0,
    lam: float | None = 256.0,
    importance: bool = True,
) -> torch.Tensor:
    """Eq. 23 pair by pair, with eta (eq. 15) and W (eqs. 24-25) as printed in LOSSES.md."""
    classes, images = len(counts), sum(counts.values())
    if design == "group":
        pairs = [(i, j) for i in range(len(labels)) for j in range(len(labels)) if i != j]
    else:
        pairs = [pair for k in range(0, len(labels), 2) for pair in ((k, k + 1), (k + 1, k))]
    total = emb.new_zeros(())
    for i, j in pairs:
        size_i, size_j = counts[labels[i]], counts[labels[j]]
        same = labels[i] == labels[j]
        d = torch.linalg.norm(emb[i] - emb[j])
        eta = 1.0 if lam is None else lam / (classes - 1) * (size_i - 1) / size_j
        if not importance:
            w = 1.0
        elif design == "group" and same:
            w = classes * (m * n - 1) * size_i * (size_i - 1) / ((m - 1) * images * (images - 1))
        elif design == "group":
            w = (
                classes * (classes - 1) * (m * n - 1) * size_i * size_j
                / (m * (n - 1) * images * (images - 1))
            )  # fmt: skip
        elif same:
            w = classes * size_i * (size_i - 1) / (p * images * (images - 1))
        else:
            w = classes * (classes - 1) * size_i * size_j / ((1 - p) * images * (images - 1))
        if same:
            total = total + w * d**2
        else:
            total = total + w * eta * torch.clamp(margin - d, min=0.0) ** 2
    return total / len(pairs)


def group_batch(seed: int, m: int = 3, n: int = 4) -> tuple[torch.Tensor, list[int]]:
    generator = torch.Generator().manual_seed(seed)
    classes = torch.randperm(len(COUNTS), generator=generator)[:n].tolist()
    labels = [sorted(COUNTS)[c] for c in classes for _ in range(m)]
    emb = torch.nn.functional.normalize(
        torch.randn(m * n, 4, generator=generator, dtype=torch.float64), dim=1
    )
    return emb, labels


def random_batch(seed: int, pairs: int = 10) -> tuple[torch.Tensor, list[int]]:
    generator = torch.Generator().manual_seed(seed)
    keys = sorted(COUNTS)
    labels = []
    for k in range(pairs):
        first = keys[int(torch.randint(len(keys), (1,), generator=generator))]
        second = first if k % 3 == 0 else keys[(keys.index(first) + 1 + k % 4) % len(keys)]
        labels += [first, second]
    emb = torch.nn.functional.normalize(
        torch.randn(2 * pairs, 4, generator=generator, dtype=torch.float64), dim=1
    )
    return emb, labels


CASES = [
    {"design": "group", "m": 3, "n": 4},
    {"design": "group", "m": 3, "n": 4, "importance": False},
    {"design": "group", "m": 3, "n": 4, "lam": None},
    {"design": "group", "lam": None, "importance": False},
    {"design": "random", "p": 0.3},
    {"design": "random", "p": 0.7, "importance": False},
    {"design": "random", "p": 0.5, "lam": None},
    {"design": "random", "lam": None, "importance": False},
]


@pytest.mark.parametrize("params", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("seed", [0, 1])
def test_value_and_gradient_match_loop_reference(params: dict, seed: int) -> None:
    params = {"margin": 1.2, **params}
    emb, labels = group_batch(seed) if params["design"] == "group" else random_batch(seed)
    loss = BalancedContrastiveLoss(class_counts=COUNTS, **params)

    mine = emb.clone().requires_grad_()
    value = loss(mine, torch.tensor(labels))
    value.backward()
    ref_emb = emb.clone().requires_grad_()
    expected = reference_loss(ref_emb, labels, COUNTS, **params)
    expected.backward()

    assert value.dtype == torch.float64
    assert float(value.detach()) == pytest.approx(float(expected.detach()), rel=1e-6)
    assert float(expected.detach()) > 0
    torch.testing.assert_close(mine.grad, ref_emb.grad, rtol=1e-6, atol=1e-12)


def test_margin_term_is_active_in_the_reference_batches() -> None:
    # guard for the test above: some negative pairs must sit inside the margin
    emb, labels = group_batch(0)
    d = torch.cdist(emb, emb)
    labels_t = torch.tensor(labels)
    negative = labels_t[:, None] != labels_t[None, :]
    assert bool((d[negative] < 1.2).any()) and bool((d[negative] > 1.2).any())


def test_eta_is_eq_15_not_the_eq_16_typo() -> None:
    loss = BalancedContrastiveLoss(class_counts=COUNTS, design="group", m=3, n=4, lam=256)
    eta = loss.negative_weights(torch.tensor([0]), torch.tensor([7]))  # N = 3 and 8, L = 6
    assert float(eta) == pytest.approx(256 / 5 * (3 - 1) / 8)
    eta_reverse = loss.negative_weights(torch.tensor([7]), torch.tensor([0]))
    assert float(eta_reverse) == pytest.approx(256 / 5 * (8 - 1) / 3)


# ---------------------------------------------------------------- W = P_U / Q


def group_design_q(counts: dict[int, int], m: int, n: int) -> dict[tuple[int, int], Fraction]:
    """Q(i, j) of the (m,n)-group design by exact enumeration: every n-subset of classes is
    equally likely, then every m-subset of each class, then one ordered pair of the batch."""
    members = {}
    start = 0
    for label in sorted(counts):
        members[label] = list(range(start, start + counts[label]))
        start += counts[label]
    q: dict[tuple[int, int], Fraction] = {}
    class_sets = list(itertools.combinations(sorted(counts), n))
    pick_pair = Fraction(1, m * n * (m * n - 1))
    for class_set in class_sets:
        choices = [list(itertools.combinations(members[c], m)) for c in class_set]
        p_batch = Fraction(1, len(class_sets) * math.prod(len(c) for c in choices))
        for parts in itertools.product(*choices):
            batch = [i for part in parts for i in part]
            for i, j in itertools.permutations(batch, 2):
                q[i, j] = q.get((i, j), Fraction(0)) + p_batch * pick_pair
    return q


def random_design_q(counts: dict[int, int], p: Fraction) -> dict[tuple[int, int], Fraction]:
    """Q(i, j) of the p-random design, walking its decision tree (section 4.1)."""
    members, start = {}, 0
    for label in sorted(counts):
        members[label] = list(range(start, start + counts[label]))
        start += counts[label]
    classes = sorted(counts)
    q: dict[tuple[int, int], Fraction] = {}
    for c in classes:  # positive: a class uniformly, then an ordered pair of its images
        for i, j in itertools.permutations(members[c], 2):
            share = p / len(classes) / (len(members[c]) * (len(members[c]) - 1))
            q[i, j] = q.get((i, j), Fraction(0)) + share
    for c1, c2 in itertools.permutations(classes, 2):  # negative: two distinct classes
        for i in members[c1]:
            for j in members[c2]:
                share = (1 - p) / (len(classes) * (len(classes) - 1))
                share /= len(members[c1]) * len(members[c2])
                q[i, j] = q.get((i, j), Fraction(0)) + share
    return q


def labels_of(counts: dict[int, int]) -> list[int]:
    return [label for label in sorted(counts) for _ in range(counts[label])]


@pytest.mark.parametrize(
    ("counts", "m", "n"),
    [
        ({0: 2, 1: 3, 2: 3, 3: 4}, 2, 2),
        ({0: 2, 1: 3, 2: 3, 3: 4}, 2, 3),
        ({0: 3, 1: 3, 2: 4, 5: 5}, 3, 3),
    ],
)
def test_group_weights_equal_uniform_over_enumerated_q(counts: dict, m: int, n: int) -> None:
    q = group_design_q(counts, m, n)
    labels = labels_of(counts)
    total = len(labels)
    assert sum(q.values()) == 1
    assert len(q) == total * (total - 1)  # every ordered pair can be drawn
    loss = BalancedContrastiveLoss(class_counts=counts, design="group", m=m, n=n)
    labels_t = torch.tensor(labels)
    weights = loss.importance_weights(labels_t[:, None], labels_t[None, :])
    for (i, j), q_ij in q.items():
        expected = Fraction(1, total * (total - 1)) / q_ij
        assert float(weights[i, j]) == pytest.approx(float(expected), rel=1e-12)


@pytest.mark.parametrize("p", [Fraction(1, 10), Fraction(1, 2), Fraction(9, 10)])
def test_random_weights_equal_uniform_over_enumerated_q(p: Fraction) -> None:
    counts = {0: 2, 1: 3, 2: 5, 4: 4}
    q = random_design_q(counts, p)
    labels = labels_of(counts)
    total = len(labels)
    assert sum(q.values()) == 1 and len(q) == total * (total - 1)
    loss = BalancedContrastiveLoss(class_counts=counts, design="random", p=float(p))
    labels_t = torch.tensor(labels)
    weights = loss.importance_weights(labels_t[:, None], labels_t[None, :])
    for (i, j), q_ij in q.items():
        expected = Fraction(1, total * (total - 1)) / q_ij
        assert float(weights[i, j]) == pytest.approx(float(expected), rel=1e-12)


# ---------------------------------------------------------------- configuration


def test_built_by_name_like_losses_md_example() -> None:
    loss = build_loss(
        "bcontrastive", margin=1.0, lam=256, class_counts=COUNTS, design="group", m=3, n=4
    )
    assert isinstance(loss, BalancedContrastiveLoss)
    assert (loss.num_classes, loss.num_images) == (6, 33)


def test_string_keys_from_a_config_file_are_accepted() -> None:
    loss = BalancedContrastiveLoss(class_counts={"0": 3, "1": 4}, design="random", p=0.5)
    assert loss.num_classes == 2


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"design": "pairs", "p": 0.5}, "unknown design"),
        ({"design": "group"}, "needs m"),
        ({"design": "group", "m": 3}, "needs m"),
        ({"design": "group", "m": 1, "n": 4}, ">= 2"),
        ({"design": "group", "m": 3, "n": 7}, "n=7"),
        ({"design": "group", "m": 4, "n": 2}, "fewer than 4 images"),
        ({"design": "group", "m": 3, "n": 4, "p": 0.5}, "p belongs"),
        ({"design": "random"}, "needs p"),
        ({"design": "random", "p": 1.0}, "strictly between"),
        ({"design": "random", "p": 0.5, "m": 3, "n": 4}, "belong to design='group'"),
        ({"design": "random", "p": 0.5, "margin": 0}, "margin"),
        ({"design": "random", "p": 0.5, "lam": -1}, "lam"),
    ],
)
def test_bad_parameters_are_rejected(params: dict, message: str) -> None:
    with pytest.raises(LossConfigError, match=message):
        BalancedContrastiveLoss(class_counts=COUNTS, **params)


def test_class_counts_are_required_unless_classic_and_unweighted() -> None:
    with pytest.raises(LossConfigError, match="needs class_counts"):
        BalancedContrastiveLoss(design="random", p=0.5)
    with pytest.raises(LossConfigError, match="fewer than 2 images"):
        BalancedContrastiveLoss(class_counts={0: 1, 1: 3}, design="random", p=0.5)
    plain = BalancedContrastiveLoss(design="group", lam=None, importance=False)
    emb, labels = group_batch(0)
    expected = reference_loss(emb, labels, COUNTS, "group", lam=None, importance=False)
    assert float(plain(emb, torch.tensor(labels))) == pytest.approx(float(expected), rel=1e-9)


def test_labels_outside_class_counts_and_wrong_batches_are_rejected() -> None:
    loss = BalancedContrastiveLoss(class_counts=COUNTS, design="group", m=3, n=4)
    emb, labels = group_batch(0)
    with pytest.raises(LossConfigError, match=r"labels \[5\] are not in class_counts"):
        loss(emb, torch.tensor([5] + labels[1:]))
    with pytest.raises(LossConfigError, match="expects batches of 12"):
        loss(emb[:11], torch.tensor(labels[:11]))
    random_loss = BalancedContrastiveLoss(class_counts=COUNTS, design="random", p=0.5)
    with pytest.raises(LossConfigError, match="even batch"):
        random_loss(emb[:11], torch.tensor(labels[:11]))


def test_identical_embeddings_give_finite_gradients() -> None:
    loss = BalancedContrastiveLoss(class_counts=COUNTS, design="group", m=3, n=4)
    emb = torch.nn.functional.normalize(torch.ones(12, 4), dim=1).requires_grad_()
    _, labels = group_batch(0)
    value = loss(emb, torch.tensor(labels))
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(emb.grad).all()
