"""NRA (nearsight/training/losses/nra.py) against a loop reference written from the slides' equations."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import (
    assert_float32_agrees_with_float64,
    assert_no_python_loop_over_anchors,
    autograd,
    random_batch,
)

from nearsight.training.losses.nra import NonlinearRankApproximationLoss, rank_transfer


def reference_w(r: float, alpha: float) -> float:
    return 0.5 * (2 * r) ** alpha if r < 0.5 else 1 - 0.5 * (2 * (1 - r)) ** alpha


def reference_nra(emb, labels, alpha=2.0, detach_extremes=False, include_anchor=False):
    """Loop over anchors and their rows; autograd through every distance, Dmin and Dmax
    (``detach_extremes`` holds Dmin and Dmax constant instead, for contrast).
    ``include_anchor``: the row also holds j = i with d_ii = 0 (the second reading)."""
    leaf = emb.clone().requires_grad_(True)
    n = emb.shape[0]
    total = torch.zeros((), dtype=emb.dtype)
    for i in range(n):
        row = {j: torch.linalg.vector_norm(leaf[i] - leaf[j]) for j in range(n) if j != i}
        extremes = list(row.values()) + ([leaf.new_zeros(())] if include_anchor else [])
        d_min = torch.stack(extremes).min()
        d_max = torch.stack(extremes).max()
        if detach_extremes:
            d_min, d_max = d_min.detach(), d_max.detach()
        span = d_max - d_min

        def similarity(d, d_min=d_min, span=span):
            r = (d - d_min) / span if span.item() > 0 else d * 0
            if r.item() in (0.0, 1.0):
                # the ends: s is clamped there (s = 1 or 0), so the gradient is 0 anyway;
                # (2r)^alpha would give an infinite derivative for alpha < 1
                w = r * 0 + r.item()
            elif r.item() < 0.5:
                w = 0.5 * (2 * r) ** alpha
            else:
                w = 1 - 0.5 * (2 * (1 - r)) ** alpha
            return (1 - w).clamp(1e-7, 1 - 1e-7)

        positives = [row[j] for j in row if labels[j] == labels[i]]
        negatives = [row[j] for j in row if labels[j] != labels[i]]
        if positives:
            total = total + torch.log(similarity(torch.stack(positives).max()))
        if negatives:
            total = total + torch.log(1 - similarity(torch.stack(negatives).min()))
    loss = -total / n
    (grad,) = torch.autograd.grad(loss, leaf)
    return loss.item(), grad


def test_transfer_function_values_from_losses_md():
    r = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0], dtype=torch.float64)
    torch.testing.assert_close(
        rank_transfer(r, 2.0), torch.tensor([0.0, 0.125, 0.5, 0.875, 1.0], dtype=torch.float64)
    )


@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0, 3.5])
def test_transfer_function_matches_the_piecewise_definition(alpha):
    r = torch.linspace(0, 1, 41, dtype=torch.float64)
    expected = torch.tensor([reference_w(x, alpha) for x in r.tolist()], dtype=torch.float64)
    torch.testing.assert_close(rank_transfer(r, alpha), expected)
    r = r.clone().requires_grad_(True)
    rank_transfer(r, alpha).sum().backward()
    assert torch.isfinite(r.grad).all()


@pytest.mark.parametrize(
    ("n", "dim", "classes", "seed", "alpha"),
    [
        (12, 8, 3, 0, 2.0),
        (18, 16, 6, 1, 2.0),
        (24, 12, 4, 2, 1.0),
        (20, 8, 5, 3, 3.0),
        (16, 8, 4, 4, 0.5),
    ],
)
def test_value_and_gradient_match_loop_reference(n, dim, classes, seed, alpha):
    emb, labels = random_batch(n, dim, classes, seed)
    value, grad = autograd(NonlinearRankApproximationLoss(alpha=alpha), emb, labels)
    ref_value, ref_grad = reference_nra(emb, labels, alpha)
    assert value.item() == pytest.approx(ref_value, rel=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-12)
    assert grad.abs().sum() > 0


@pytest.mark.parametrize(
    ("n", "dim", "classes", "seed", "alpha"),
    [(12, 8, 3, 0, 2.0), (18, 16, 6, 1, 2.0), (24, 12, 4, 2, 1.0), (16, 8, 4, 4, 0.5)],
)
def test_include_anchor_value_and_gradient_match_loop_reference(n, dim, classes, seed, alpha):
    emb, labels = random_batch(n, dim, classes, seed)
    loss = NonlinearRankApproximationLoss(alpha=alpha, include_anchor=True)
    value, grad = autograd(loss, emb, labels)
    ref_value, ref_grad = reference_nra(emb, labels, alpha, include_anchor=True)
    assert value.item() == pytest.approx(ref_value, rel=1e-9)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-9, atol=1e-12)
    # a different loss from the default reading
    default_value, _ = autograd(NonlinearRankApproximationLoss(alpha=alpha), emb, labels)
    assert abs(default_value.item() - value.item()) > 1e-3


def test_include_anchor_keeps_the_negative_term_alive_at_a_nearest_negative():
    # anchor 0's nearest neighbour is the negative 2: under the default reading its negative
    # term is pinned at the clamp; with the anchor in its row r(D-) = d02 / Dmax > 0
    emb = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.9, 0.1]], dtype=torch.float64)
    emb = torch.nn.functional.normalize(emb, dim=1)
    labels = torch.tensor([0, 0, 1])
    d = torch.cdist(emb, emb)
    rank = float(d[0, 2] / d[0].max())
    loss = NonlinearRankApproximationLoss(include_anchor=True)
    value, grad = autograd(loss, emb, labels)
    ref_value, ref_grad = reference_nra(emb, labels, include_anchor=True)
    assert value.item() == pytest.approx(ref_value, rel=1e-9)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-9, atol=1e-12)
    # anchor 0's negative term by hand: -log(1 - s) = -log(w(r)), w(r) = 0.5 (2r)^2 below 1/2
    assert 0 < rank < 0.5
    default_value, grad_default = autograd(NonlinearRankApproximationLoss(), emb, labels)
    assert value.item() < default_value.item()
    assert -math.log(reference_w(rank, 2.0)) < -math.log(1e-7)
    assert grad[2].abs().sum() > 0 and not torch.allclose(grad, grad_default)


def test_include_anchor_is_built_by_name():
    from nearsight.training.losses import build_loss

    loss = build_loss("nra", alpha=2.0, include_anchor=True)
    assert loss.include_anchor is True
    assert build_loss("nra").include_anchor is False


def test_default_reading_nearest_negative_still_moves_through_the_positive_term():
    # the module docstring's claim, on anchor 0's own two terms: its nearest neighbour is the
    # negative 2, so its negative term is pinned (r = 0), yet its positive term depends on
    # Dmin = d02 and moves point 2
    emb = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.9, 0.1], [-1.0, 0.2]], dtype=torch.float64)
    leaf = torch.nn.functional.normalize(emb, dim=1).requires_grad_(True)
    row = torch.linalg.vector_norm(leaf[0] - leaf[1:], dim=1)  # d01, d02, d03
    assert int(row.argmin()) == 1
    d_min, d_max = row.min(), row.max()
    negative_rank = (row[1] - d_min) / (d_max - d_min)
    positive_rank = (row[0] - d_min) / (d_max - d_min)
    (negative_grad,) = torch.autograd.grad(
        rank_transfer(negative_rank, 2.0), leaf, retain_graph=True
    )
    assert negative_rank.item() == 0.0 and torch.count_nonzero(negative_grad) == 0
    positive_term = -torch.log(1 - rank_transfer(positive_rank, 2.0))
    (positive_grad,) = torch.autograd.grad(positive_term, leaf)
    assert 0 < positive_rank.item() < 1 and positive_grad[2].abs().sum() > 0


def test_gradient_flows_through_dmin_and_dmax():
    emb, labels = random_batch(16, 8, 4, seed=12)
    _, grad = autograd(NonlinearRankApproximationLoss(), emb, labels)
    _, ref_grad = reference_nra(emb, labels)
    _, detached_grad = reference_nra(emb, labels, detach_extremes=True)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-12)
    assert (grad - detached_grad).abs().max() > 1e-3


def test_anchor_alone_in_its_class_has_only_the_negative_term():
    emb, labels = random_batch(13, 8, 4, seed=6)
    labels = labels.clone()
    labels[0] = 99
    value, grad = autograd(NonlinearRankApproximationLoss(), emb, labels)
    ref_value, ref_grad = reference_nra(emb, labels)
    assert torch.isfinite(value) and torch.isfinite(grad).all()
    assert value.item() == pytest.approx(ref_value, rel=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-12)


def test_single_class_batch_has_only_positive_terms():
    emb, _ = random_batch(8, 8, 1, seed=6)
    labels = torch.zeros(8, dtype=torch.long)
    value, grad = autograd(NonlinearRankApproximationLoss(), emb, labels)
    ref_value, ref_grad = reference_nra(emb, labels)
    assert value.item() == pytest.approx(ref_value, rel=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-12)


def test_perfect_ranking_gives_near_zero_loss_and_finite_gradient():
    # each anchor: its one positive is the nearest (r = 0, s = 1), and the hardest negative
    # sits at the far end (r ~ 1, s ~ 0): both log terms ~ 0 (up to the 1e-7 clamp)
    emb = torch.tensor(
        [[1.0, 0.0], [0.999, 0.04], [-1.0, 0.0], [-0.999, -0.04]], dtype=torch.float64
    )
    emb = torch.nn.functional.normalize(emb, dim=1)
    labels = torch.tensor([0, 0, 1, 1])
    value, grad = autograd(NonlinearRankApproximationLoss(), emb, labels)
    assert 0.0 <= value.item() < 1e-3
    assert torch.isfinite(grad).all()


def test_nearest_negative_saturates_the_clamp():
    # when the hardest negative is the row's nearest point, r(D-) = 0 exactly, s = 1 and the
    # term is -log(1e-7) (the clamp), constant under small moves: no gradient from it
    emb = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.9, 0.1]], dtype=torch.float64)
    emb = torch.nn.functional.normalize(emb, dim=1)
    labels = torch.tensor([0, 0, 1])
    value, _ = autograd(NonlinearRankApproximationLoss(), emb, labels)
    ref_value, _ = reference_nra(emb, labels)
    assert value.item() == pytest.approx(ref_value, rel=1e-9)
    assert value.item() >= -math.log(1e-7) / 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_identical_embeddings_give_finite_value_and_gradient(dtype):
    emb = torch.nn.functional.normalize(torch.ones(12, 8, dtype=dtype), dim=1)
    labels = torch.arange(12) % 3
    value, grad = autograd(NonlinearRankApproximationLoss(), emb, labels)
    # all distances equal: r = 0, s = 1 - 1e-7 for both terms (exact in float32 too)
    expected = -(math.log(1 - 1e-7) + math.log(1e-7))
    assert value.item() == pytest.approx(expected, rel=1e-6)
    assert torch.isfinite(grad).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_large_alpha_and_batch_stay_finite(dtype):
    emb, labels = random_batch(64, 16, 8, seed=9)
    value, grad = autograd(NonlinearRankApproximationLoss(alpha=50.0), emb.to(dtype), labels)
    assert torch.isfinite(value) and torch.isfinite(grad).all()


def test_single_embedding_gives_zero():
    emb, _ = random_batch(1, 8, 1, seed=0)
    value, grad = autograd(NonlinearRankApproximationLoss(), emb, torch.tensor([0]))
    assert value.item() == 0.0 and torch.count_nonzero(grad) == 0


def test_no_python_loop_over_anchors():
    assert_no_python_loop_over_anchors(NonlinearRankApproximationLoss())


def test_float32_agrees_with_float64():
    assert_float32_agrees_with_float64(NonlinearRankApproximationLoss(alpha=2.0))


@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0, 3.0])
def test_log_similarities_match_clamped_logs_with_their_derivatives(alpha):
    from nearsight.training.losses.nra import log_similarities

    ranks = [0.0, 0.1, 0.3, 0.5, 0.7, 0.95, 1.0]
    r = torch.tensor(ranks, dtype=torch.float64, requires_grad=True)
    log_s, log_one_minus_s = log_similarities(r, alpha)
    (grad_s,) = torch.autograd.grad(log_s.sum(), r, retain_graph=True)
    (grad_one_minus_s,) = torch.autograd.grad(log_one_minus_s.sum(), r)
    for k, x in enumerate(ranks):
        s = min(max(1 - reference_w(x, alpha), 1e-7), 1 - 1e-7)
        assert log_s[k].item() == pytest.approx(math.log(s), rel=1e-9, abs=1e-12)
        assert log_one_minus_s[k].item() == pytest.approx(math.log(1 - s), rel=1e-9, abs=1e-12)
        if 0 < x < 1:  # inside: d/dr log s = -w'(r)/s and d/dr log(1 - s) = w'(r)/(1 - s)
            w_prime = (
                alpha * (2 * x) ** (alpha - 1) if x < 0.5 else alpha * (2 * (1 - x)) ** (alpha - 1)
            )
            assert grad_s[k].item() == pytest.approx(-w_prime / s, rel=1e-9)
            assert grad_one_minus_s[k].item() == pytest.approx(w_prime / (1 - s), rel=1e-9)
