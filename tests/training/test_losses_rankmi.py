"""RankMI (nearsight/training/losses/rankmi.py): eq. 6, the statistics network, Newton's beta, the
critic/embedding split of Algorithm 1 and distance-weighted negative sampling."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nearsight.training.losses import build_loss
from nearsight.training.losses._pairs import pairwise_distances
from nearsight.training.losses.rankmi import RankMILoss, distance_weighted_sample
from nearsight.training.losses.registry import LossConfigError


def unit(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(x, dim=1)


def reference_v(critic: nn.Module, d: float) -> float:
    """V(d) = Vt(d) - d in float64 with a private copy of the critic."""
    with torch.no_grad():
        return float(critic(torch.tensor([[d]], dtype=torch.float64))) - d


def reference_eq6(critic: nn.Module, d_pos: list[float], d_neg: list[float]) -> float:
    """Eq. 6 written as in the paper, with T(d) = log 2 - log(1 + exp(-V(d)))."""

    def t_of(d: float) -> float:
        return math.log(2.0) - math.log1p(math.exp(-reference_v(critic, d)))

    total = 0.0
    if d_pos:
        total -= sum(t_of(d) for d in d_pos) / len(d_pos)
    if d_neg:
        total -= sum(math.log(2.0 - math.exp(t_of(d))) for d in d_neg) / len(d_neg)
    return total


def bisection_root(critic: nn.Module, lo: float, hi: float) -> float:
    f_lo = reference_v(critic, lo)
    assert f_lo * reference_v(critic, hi) < 0, "the test needs a bracketed root"
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        f_mid = reference_v(critic, mid)
        if (f_mid < 0) == (f_lo < 0):
            lo, f_lo = mid, f_mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


class FixedPotential(nn.Module):
    """A stand-in critic with a chosen V: Vt(d) = d + fn(d), so V(d) = fn(d)."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn
        self.unused = nn.Parameter(torch.zeros(1))  # potential() reads the critic's dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fn(x) + 0.0 * self.unused


# ---------------------------------------------------------------- eq. 6


def test_critic_loss_softplus_form_equals_paper_form_float64() -> None:
    torch.manual_seed(0)
    loss = RankMILoss().double()
    emb = unit(torch.randn(10, 6, dtype=torch.float64))
    labels = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 3])
    value = float(loss.critic_loss(emb, labels).detach())

    d = torch.cdist(emb, emb)
    d_pos, d_neg = [], []
    for i in range(10):
        for j in range(10):
            if i != j:
                (d_pos if labels[i] == labels[j] else d_neg).append(float(d[i, j]))
    expected = reference_eq6(loss.critic, d_pos, d_neg)
    assert value == pytest.approx(expected, rel=1e-6)


def test_embedding_loss_equals_paper_form_when_sampling_is_forced() -> None:
    # labels 0,0,1: each anchor of the one positive pair has exactly one negative, so the
    # sampling is deterministic and eq. 6 can be written out by hand
    torch.manual_seed(1)
    loss = RankMILoss(margin=5.0).double()  # margin 5: every pair is kept
    emb = unit(torch.randn(3, 5, dtype=torch.float64))
    labels = torch.tensor([0, 0, 1])
    d = torch.cdist(emb, emb)
    expected = reference_eq6(
        loss.critic,
        [float(d[0, 1]), float(d[1, 0])],
        [float(d[0, 2]), float(d[1, 2])],
    )
    assert float(loss(emb, labels)) == pytest.approx(expected, rel=1e-6)


def test_margins_filter_pairs_around_beta() -> None:
    # points on a circle at chosen distances from point 0
    def at(d: float) -> list[float]:
        theta = 2 * math.asin(d / 2)
        return [math.cos(theta), math.sin(theta)]

    emb = torch.tensor([at(0.0), at(0.5), at(1.2), at(0.7), at(1.5)], dtype=torch.float64)
    labels = torch.tensor([0, 0, 0, 1, 2])
    loss = RankMILoss(margin=0.2, beta0=1.0).double()
    (anchors, positives), (neg_anchors, negatives) = loss.select_pairs(
        torch.cdist(emb, emb), labels, dim=2
    )
    kept = set(zip(anchors.tolist(), positives.tolist(), strict=True))
    # d01 = 0.5 <= 0.8 dropped; d02 = 1.2 kept; d12 on the circle = 2 sin(|a2 - a1| / 2)
    d = torch.cdist(emb, emb)
    expected = {(i, j) for i in range(3) for j in range(3) if i != j and d[i, j] > 0.8}
    assert kept == expected and (0, 2) in kept and (0, 1) not in kept
    # anchor 0's only negative below beta + alpha = 1.2 is point 3 (d = 0.7); point 4 is at 1.5
    for a, n in zip(neg_anchors.tolist(), negatives.tolist(), strict=True):
        assert labels[a] != labels[n] and d[a, n] < 1.2
        if a == 0:
            assert n == 3


# ---------------------------------------------------------------- statistics network


@pytest.mark.parametrize(("hidden", "layers"), [(128, 2), (16, 0), (8, 3)])
def test_statistics_network_structure_and_parameters(hidden: int, layers: int) -> None:
    loss = RankMILoss(hidden=hidden, layers=layers)
    modules = list(loss.critic)
    linears = [m for m in modules if isinstance(m, nn.Linear)]
    relus = [m for m in modules if isinstance(m, nn.LeakyReLU)]
    assert len(modules) == 2 * (layers + 1) + 1
    assert [(m.in_features, m.out_features) for m in linears] == (
        [(1, hidden)] + [(hidden, hidden)] * layers + [(hidden, 1)]
    )
    assert len(relus) == layers + 1 and all(r.negative_slope == 0.1 for r in relus)
    assert isinstance(modules[-1], nn.Linear)
    for linear in linears:  # Xavier-uniform bound sqrt(6 / (fan_in + fan_out))
        bound = math.sqrt(6.0 / (linear.in_features + linear.out_features))
        assert linear.weight.abs().max() <= bound
        assert linear.weight.abs().max() > 0.5 * bound
    own = {id(p) for p in loss.critic.parameters()}
    assert {id(p) for p in loss.parameters()} == own
    assert len(list(loss.parameters())) == 2 * (layers + 2)


def test_critic_optimizer_is_adam_over_the_critic() -> None:
    loss = RankMILoss()
    optimizer = loss.critic_optimizer()
    assert isinstance(optimizer, torch.optim.Adam)
    group = optimizer.param_groups[0]
    assert group["lr"] == 1e-3 and group["weight_decay"] == 1e-4
    assert {id(p) for p in group["params"]} == {id(p) for p in loss.parameters()}


def test_algorithm_1_schedule() -> None:
    assert [RankMILoss(critic_steps=1).is_critic_step(t) for t in range(5)] == [
        False, True, False, True, False,
    ]  # fmt: skip
    assert [RankMILoss(critic_steps=2).is_critic_step(t) for t in range(6)] == [
        False, True, True, False, True, True,
    ]  # fmt: skip


# ---------------------------------------------------------------- beta


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("target", [0.35, 0.9, 1.6])
def test_newton_beta_matches_bisection(seed: int, target: float) -> None:
    torch.manual_seed(seed)
    loss = RankMILoss()
    with torch.no_grad():  # shift the output so that V has a root near `target`
        shift = reference_v(copy.deepcopy(loss.critic).double(), target)
        loss.critic[-1].bias -= shift
    critic64 = copy.deepcopy(loss.critic).double()
    expected = bisection_root(critic64, max(0.0, target - 0.3), min(2.0, target + 0.3))
    beta = loss.update_beta()
    assert beta == loss.beta
    assert beta == pytest.approx(expected, abs=1e-6)
    assert abs(reference_v(critic64, beta)) < 1e-6
    assert 1 <= loss.last_newton_steps <= 20


def test_update_beta_is_warm_started() -> None:
    # V(d) = cos(pi d) has roots 0.5 and 1.5: which one Newton finds depends on where it starts
    for start, root in [(0.6, 0.5), (0.4, 0.5), (1.4, 1.5), (1.6, 1.5)]:
        loss = RankMILoss(beta0=start)
        loss.critic = FixedPotential(lambda x: torch.cos(math.pi * x))
        assert loss.update_beta() == pytest.approx(root, abs=1e-9)
    # a converged beta stays put after one evaluation
    torch.manual_seed(3)
    loss = RankMILoss()
    with torch.no_grad():
        loss.critic[-1].bias -= reference_v(copy.deepcopy(loss.critic).double(), 0.8)
    first = loss.update_beta()
    assert loss.update_beta() == pytest.approx(first, abs=1e-9)
    assert loss.last_newton_steps <= 2


def test_update_beta_is_clamped_into_0_2() -> None:
    loss = RankMILoss()
    loss.beta_rooted = True  # past the first steps (see the test below)
    with torch.no_grad():
        loss.critic[-1].bias += 50.0  # V > 0 on [0, 2]: the root lies beyond 2
    assert loss.update_beta() == 2.0
    with torch.no_grad():
        loss.critic[-1].bias -= 100.0  # V < 0 on [0, 2]
    assert loss.update_beta() == 0.0
    # the Newton step cap: a far root needs more steps than a clamped one
    assert loss.last_newton_steps <= 20


def test_the_first_steps_keep_beta0_until_the_critic_has_a_root() -> None:
    """RankMI's first step (docs/reproducing.md): a freshly initialised statistics network often has
    no root of V in [0, 2] (4 of these 6 seeds); clamping gave beta = 0, so the first embedding
    step (Algorithm 1 updates the embedding at t = 0) kept no negative. beta0 stands instead,
    until an update finds a root; from then on the clamped estimate is used."""
    rootless = 0
    for seed in range(6):
        torch.manual_seed(seed)
        loss = RankMILoss(beta0=1.0)
        beta = loss.update_beta()
        if loss.beta_rooted:
            assert abs(loss._potential64(beta)) <= 1e-5
        else:
            rootless += 1
            assert beta == loss.beta == 1.0
    assert rootless == 4
    torch.manual_seed(1)
    loss = RankMILoss(beta0=1.0)
    assert loss.update_beta() == 1.0 and not loss.beta_rooted
    with torch.no_grad():  # the critic learns: V now has a root in [0, 2]
        loss.critic[-1].bias += loss.potential(torch.tensor([1.3])).neg().detach().squeeze()
    root = loss.update_beta()
    assert loss.beta_rooted and root == pytest.approx(1.3, abs=1e-4)
    with torch.no_grad():  # then loses it: the clamped estimate stands, as before
        loss.critic[-1].bias -= 100.0
    assert loss.update_beta() == 0.0
    # the flag survives a checkpoint, so a resumed run does not fall back to beta0
    restored = RankMILoss(beta0=1.0)
    restored.load_state_dict(loss.state_dict())
    assert restored.beta_rooted and restored.beta == 0.0


def test_update_beta_with_flat_potential_keeps_beta() -> None:
    loss = RankMILoss(beta0=0.7)
    loss.critic = FixedPotential(lambda x: torch.ones_like(x))  # V = 1, V' = 0
    assert loss.update_beta() == 0.7
    loss.critic = FixedPotential(lambda x: torch.sin(20 * x))  # oscillating: capped at 20 steps
    beta = loss.update_beta()
    assert 0.0 <= beta <= 2.0 and loss.last_newton_steps <= 20


def test_beta_and_sampling_state_round_trip_through_state_dict() -> None:
    torch.manual_seed(4)
    loss = RankMILoss(seed=7)
    with torch.no_grad():
        loss.critic[-1].bias -= reference_v(copy.deepcopy(loss.critic).double(), 1.1)
    loss.update_beta()
    emb = unit(torch.randn(16, 8))
    labels = torch.arange(16) // 4
    loss(emb, labels)  # advance the generator
    saved = copy.deepcopy(loss.state_dict())
    expected_next = loss(emb, labels)

    restored = RankMILoss(seed=123)
    restored.load_state_dict(saved)
    assert restored.beta == loss.beta and restored.beta != 1.0
    assert torch.equal(restored(emb, labels), expected_next)


# ---------------------------------------------------------------- gradient flow


def test_critic_loss_reaches_only_the_critic_and_loss_only_the_embeddings() -> None:
    torch.manual_seed(5)
    loss = RankMILoss(margin=5.0)
    emb = unit(torch.randn(12, 8)).requires_grad_()
    labels = torch.arange(12) // 3

    loss.critic_loss(emb, labels).backward()
    assert emb.grad is None
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in loss.parameters())

    loss.zero_grad(set_to_none=True)
    loss(emb, labels).backward()
    assert emb.grad is not None and emb.grad.abs().sum() > 0
    assert all(p.grad is None for p in loss.parameters())


# ---------------------------------------------------------------- distance-weighted sampling


def inverse_density(d: np.ndarray, dim: int, cutoff: float = 0.5) -> np.ndarray:
    d = np.maximum(d, cutoff)
    return 1.0 / (d ** (dim - 2) * (1 - d**2 / 4) ** ((dim - 3) / 2))


def test_distance_weighted_sample_frequencies_follow_inverse_density() -> None:
    dim = 4
    row = np.array([0.0, 0.3, 0.5, 0.7, 0.8, 1.0, 1.2, 0.9])  # 0.3 is clipped to 0.5
    candidates = np.array([False, True, True, True, True, True, False, True])
    distances = torch.tensor(np.tile(row, (8, 1)))
    mask = torch.tensor(np.tile(candidates, (8, 1)))
    draws = 400_000
    anchors = torch.zeros(draws, dtype=torch.long)
    generator = torch.Generator().manual_seed(0)
    negatives, has = distance_weighted_sample(distances, mask, anchors, dim, 0.5, generator)
    assert bool(has.all())
    counts = np.bincount(negatives.numpy(), minlength=8) / draws
    weights = np.where(candidates, inverse_density(row, dim), 0.0)
    expected = weights / weights.sum()
    assert counts[~candidates].sum() == 0
    np.testing.assert_allclose(counts[candidates], expected[candidates], rtol=0.03)
    # 0.3 and 0.5 are both clipped to 0.5: equally likely
    assert counts[1] == pytest.approx(counts[2], rel=0.03)


def test_embedding_step_negatives_follow_inverse_density() -> None:
    """Through the loss: a fixed batch, many calls, every kept positive pair draws a negative."""
    dim = 4
    negative_distances = [0.3, 0.6, 0.8, 1.0, 1.3]
    base = torch.zeros(dim, dtype=torch.float64)
    base[0] = 1.0
    rows = [base] * 20  # class 0: 20 identical images -> 380 kept positive pairs per call
    for k, d in enumerate(negative_distances):
        theta = 2 * math.asin(d / 2)
        v = torch.zeros(dim, dtype=torch.float64)
        v[0], v[1 + k % (dim - 1)] = math.cos(theta), math.sin(theta)
        rows.append(v)
    emb = torch.stack(rows)
    labels = torch.tensor([0] * 20 + [1, 2, 3, 4, 5])
    loss = RankMILoss(margin=1.5, beta0=0.5, seed=0)  # keeps d+ > -1 and d- < 2: everything
    distances = torch.cdist(emb, emb)
    counts = np.zeros(25)
    calls = 300
    for _ in range(calls):
        (anchors, _), (neg_anchors, negatives) = loss.select_pairs(distances, labels, dim)
        assert len(neg_anchors) == len(anchors) == 380
        counts += np.bincount(negatives.numpy(), minlength=25)
    frequencies = counts[20:] / counts.sum()
    weights = inverse_density(np.array(negative_distances), dim)
    np.testing.assert_allclose(frequencies, weights / weights.sum(), rtol=0.03)


# ---------------------------------------------------------------- edge cases


def test_class_with_one_image_and_no_positive_is_finite() -> None:
    torch.manual_seed(6)
    loss = RankMILoss(margin=5.0)
    emb = unit(torch.randn(5, 8)).requires_grad_()
    labels = torch.tensor([0, 1, 1, 2, 3])
    value = loss(emb, labels)
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(emb.grad).all()
    # no positive pair at all: both terms empty -> exactly 0
    emb2 = unit(torch.randn(4, 8)).requires_grad_()
    value2 = loss(emb2, torch.arange(4))
    value2.backward()
    assert value2.item() == 0.0 and torch.equal(emb2.grad, torch.zeros_like(emb2))
    critic_value = loss.critic_loss(emb2, torch.zeros(1, dtype=torch.long).expand(4))
    assert torch.isfinite(critic_value)


def test_no_positive_kept_still_pushes_violating_negatives() -> None:
    """Algorithm 1 filters positives and negatives independently: with every positive dropped
    (d+ > 2 never holds) the violating negatives (d- < 2) are still drawn and pushed away."""
    torch.manual_seed(7)
    loss = RankMILoss(margin=0.0, beta0=2.0)
    emb = unit(torch.randn(8, 8)).requires_grad_()
    labels = torch.arange(8) // 2
    (anchors, _), (neg_anchors, _) = loss.select_pairs(pairwise_distances(emb.detach()), labels, 8)
    assert len(anchors) == 0 and len(neg_anchors) == 8  # one per positive pair, none kept
    value = loss(emb, labels)
    value.backward()
    assert value.item() != 0.0 and torch.isfinite(value)
    assert emb.grad.abs().sum() > 0


def test_identical_embeddings_are_finite() -> None:
    loss = RankMILoss(margin=5.0)
    emb = unit(torch.ones(6, 8)).requires_grad_()
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    value = loss(emb, labels)
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(emb.grad).all()
    critic_value = loss.critic_loss(emb, labels)
    critic_value.backward()
    assert torch.isfinite(critic_value)
    assert all(torch.isfinite(p.grad).all() for p in loss.parameters())


# ---------------------------------------------------------------- registry


def test_built_by_name_with_paper_defaults() -> None:
    loss = build_loss("rankmi", margin=0.2, beta0=1.0, hidden=128, layers=2, critic_steps=1)
    assert isinstance(loss, RankMILoss)
    assert loss.beta == 1.0 and loss.margin == 0.2 and loss.critic_steps == 1


@pytest.mark.parametrize(
    "params",
    [{"margin": -0.1}, {"beta0": 2.5}, {"critic_steps": 0}, {"hidden": 0}, {"dws_cutoff": 0}],
)
def test_bad_parameters_are_rejected(params: dict) -> None:
    with pytest.raises(LossConfigError):
        build_loss("rankmi", **params)
    with pytest.raises(LossConfigError, match="no parameter"):
        build_loss("rankmi", alpha=0.2)


# ---------------------------------------------------------------- the corrected sampling rule


def reference_selection(
    emb: torch.Tensor, labels: torch.Tensor, beta: float, margin: float
) -> tuple[set[tuple[int, int]], dict[int, set[int]], dict[int, int]]:
    """Loops over anchors (float64): the kept positive pairs, each anchor's margin-violating
    negatives, and how many negatives it must draw (one per positive pair of the batch, kept
    or not, when it has a violating negative at all)."""
    n = len(labels)
    kept, candidates, draws = set(), {}, {}
    for i in range(n):
        positives = [j for j in range(n) if j != i and labels[j] == labels[i]]
        d = [float((emb[i] - emb[j]).norm()) for j in range(n)]
        kept |= {(i, j) for j in positives if d[j] > beta - margin}
        candidates[i] = {j for j in range(n) if labels[j] != labels[i] and d[j] < beta + margin}
        draws[i] = len(positives) if candidates[i] else 0
    return kept, candidates, draws


@pytest.mark.parametrize("seed", range(3))
def test_selection_matches_loop_reference_counts_per_anchor(seed: int) -> None:
    torch.manual_seed(seed)
    emb = torch.randn(15, 4, dtype=torch.float64)
    emb[8] = emb[7] + 0.05 * torch.randn(4, dtype=torch.float64)  # class 2's pair: too close
    emb = unit(emb)
    labels = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2, 3, 4, 4, 4, 4, 4])
    loss = RankMILoss(margin=0.2, beta0=1.1, seed=seed).double()
    kept, candidates, draws = reference_selection(emb, labels, loss.beta, loss.margin)
    # the batch must exercise the fix: an anchor with violating negatives and no kept positive
    starved = [i for i in range(15) if draws[i] and not any(a == i for a, _ in kept)]
    assert starved, "the test batch needs an anchor whose positives are all dropped"
    for _ in range(20):
        (anchors, positives), (neg_anchors, negatives) = loss.select_pairs(
            torch.cdist(emb, emb), labels, 4
        )
        assert set(zip(anchors.tolist(), positives.tolist(), strict=True)) == kept
        counts = np.bincount(neg_anchors.numpy(), minlength=15)
        assert counts.tolist() == [draws[i] for i in range(15)]
        for a, n in zip(neg_anchors.tolist(), negatives.tolist(), strict=True):
            assert n in candidates[a]
    assert all(np.bincount(neg_anchors.numpy(), minlength=15)[starved] > 0)


def test_embedding_loss_and_gradient_match_loop_reference_when_positives_are_dropped() -> None:
    """Value and gradient of the embedding step, float64, against eq. 6 written with loops over
    the pairs the rule selects. Each anchor has exactly one violating negative, so the draw is
    forced; anchor 0's positive is dropped (too close) and it still pushes its negative."""

    # class 0: two points 0.1 apart (d < beta - alpha = 0.8: both positive pairs dropped),
    # each with one violating negative, point 2 (d = 0.96 < beta + alpha = 1.2); class 2:
    # a kept positive pair (d = 0.87) far from everything else (no violating negative)
    c, s = math.cos, math.sin
    base = torch.tensor(
        [[1, 0, 0], [c(0.1), s(0.1), 0], [c(1.0), 0, s(1.0)], [-1, 0, 0], [-c(0.9), -s(0.9), 0]],
        dtype=torch.float64,
    )
    labels = torch.tensor([0, 0, 1, 2, 2])
    loss = RankMILoss(margin=0.2, beta0=1.0).double()
    emb = base.clone().requires_grad_()
    value = loss(emb, labels)
    value.backward()

    def loop_loss(points: torch.Tensor) -> torch.Tensor:
        beta, margin = loss.beta, loss.margin
        v_pos, v_neg = [], []
        for i in range(5):
            positives = [j for j in range(5) if j != i and labels[j] == labels[i]]
            violating = [
                j for j in range(5)
                if labels[j] != labels[i] and (points[i] - points[j]).norm() < beta + margin
            ]  # fmt: skip
            assert len(violating) <= 1 or not positives  # a forced draw
            for j in positives:
                d = (points[i] - points[j]).norm()
                if d > beta - margin:
                    v_pos.append(loss.potential(d.reshape(1), frozen=True)[0])
                for k in violating:
                    v_neg.append(loss.potential((points[i] - points[k]).norm().reshape(1))[0])
        total = points.new_zeros(())
        if v_pos:
            total = total + torch.stack([F.softplus(-v) for v in v_pos]).mean() - math.log(2)
        if v_neg:
            total = total + torch.stack([F.softplus(v) for v in v_neg]).mean() - math.log(2)
        return total

    points = base.clone().requires_grad_()
    expected = loop_loss(points)
    expected.backward()
    assert float(value) == pytest.approx(float(expected), rel=1e-10)
    torch.testing.assert_close(emb.grad, points.grad, rtol=1e-9, atol=1e-12)
    (anchors, _), (neg_anchors, negatives) = loss.select_pairs(torch.cdist(base, base), labels, 3)
    assert anchors.tolist() == [3, 4] and neg_anchors.tolist() == [0, 1]
    assert negatives.tolist() == [2, 2]
    # anchor 0 kept no positive, yet it and its negative move
    assert emb.grad[0].abs().sum() > 0 and emb.grad[2].abs().sum() > 0
