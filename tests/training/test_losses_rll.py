"""RLL (nearsight/training/losses/rll.py) against a loop reference written from the paper's equations."""

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

from nearsight.training.losses.registry import build_loss
from nearsight.training.losses.rll import RankedListLoss


def reference_rll(emb, labels, alpha=1.2, margin=0.4, temperature=10.0, lam=1.0):
    """One ranked list at a time (eqs. 8-14). Only the query f_i is a leaf in list i (the
    other features are constants, Sec. 3.2), so autograd on list i gives row i of the
    gradient. The eq. 9 weights are plain floats (constants), shifted by the list's largest
    exponent so that a large temperature does not overflow."""
    n = emb.shape[0]
    total = 0.0
    grad = torch.zeros_like(emb)
    for i in range(n):
        query = emb[i].clone().requires_grad_(True)
        loss_p = torch.zeros((), dtype=emb.dtype)
        loss_n = torch.zeros((), dtype=emb.dtype)
        mined_pos, mined_neg = [], []
        for j in range(n):
            if j == i:
                continue
            d = torch.linalg.vector_norm(query - emb[j])
            if labels[j] == labels[i] and d.item() > alpha - margin:
                mined_pos.append(d)
            elif labels[j] != labels[i] and d.item() < alpha:
                mined_neg.append(d)
        if mined_pos:
            loss_p = sum(d - (alpha - margin) for d in mined_pos) / len(mined_pos)
        if mined_neg:
            exponents = [temperature * (alpha - d.item()) for d in mined_neg]
            top = max(exponents)
            weights = [math.exp(e - top) for e in exponents]
            loss_n = sum(w * (alpha - d) for w, d in zip(weights, mined_neg, strict=True))
            loss_n = loss_n / sum(weights)
        list_loss = (loss_p + lam * loss_n) / n
        total += list_loss.item()
        if list_loss.requires_grad:
            (grad[i],) = torch.autograd.grad(list_loss, query)
    return total, grad


@pytest.mark.parametrize(
    ("n", "dim", "classes", "seed", "params"),
    [
        (12, 8, 3, 0, {}),
        (18, 16, 6, 1, {}),
        (24, 12, 4, 2, {"alpha": 1.4, "margin": 0.6, "temperature": 5.0, "lam": 0.5}),
        (20, 8, 5, 3, {"alpha": 1.0, "margin": 0.2, "temperature": 0.0, "lam": 2.0}),
        (16, 4, 4, 4, {"alpha": 1.2, "margin": 1.2, "temperature": 20.0, "lam": 1.0}),
    ],
)
def test_value_and_gradient_match_loop_reference(n, dim, classes, seed, params):
    emb, labels = random_batch(n, dim, classes, seed)
    value, grad = autograd(RankedListLoss(**params), emb, labels)
    ref_value, ref_grad = reference_rll(emb, labels, **params)
    assert ref_value > 0
    assert value.item() == pytest.approx(ref_value, rel=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-12)


def test_each_list_updates_only_its_query():
    # 2 images: d_01 = d_10 = d. With the gallery constant, each list pulls only its own
    # query, by (1/N) (f_i - f_j)/d; a full (non-detached) gradient would be twice that.
    emb = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), dim=1)
    emb = emb.to(torch.float64)
    _, grad = autograd(RankedListLoss(), emb, torch.tensor([0, 0]))
    d = math.sqrt(2.0)
    expected = 0.5 * (emb - emb.flip(0)) / d
    torch.testing.assert_close(grad, expected)


def test_registry_builds_rll_with_public_parameter_names():
    loss = build_loss("rll", alpha=1.2, margin=0.4, temperature=10, lam=1.0)
    assert isinstance(loss, RankedListLoss)
    assert (loss.alpha, loss.margin, loss.temperature, loss.lam) == (1.2, 0.4, 10.0, 1.0)


def test_matches_pytorch_metric_learning_value_up_to_its_conventions():
    # PML's RankedListLoss averages 0.5 L_P + 0.5 L_N (imbalance 0.5) with 1e-5 added to the
    # denominators; ours is L_P + L_N, so ours ~= 2 x PML. An independent check of the value.
    from pytorch_metric_learning.losses import RankedListLoss as PMLRankedListLoss

    emb, labels = random_batch(24, 16, 4, seed=5)
    ours = RankedListLoss(temperature=3.0)(emb, labels).item()
    pml = PMLRankedListLoss(margin=0.4, Tn=3.0, imbalance=0.5, alpha=1.2, Tp=0.0)
    assert ours == pytest.approx(2.0 * pml(emb, labels).item(), rel=1e-3)


def test_anchor_alone_in_its_class_has_only_the_negative_term():
    emb, labels = random_batch(13, 8, 4, seed=6)
    labels = labels.clone()
    labels[0] = 99
    value, grad = autograd(RankedListLoss(), emb, labels)
    ref_value, ref_grad = reference_rll(emb, labels)
    assert torch.isfinite(value) and torch.isfinite(grad).all()
    assert value.item() == pytest.approx(ref_value, rel=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-12)


def test_no_violating_pair_gives_zero_loss_and_zero_gradient():
    # classes tight (d < alpha - m = 0.8) and far apart (d > alpha = 1.2)
    generator = torch.Generator().manual_seed(0)
    centres = torch.eye(4, 8, dtype=torch.float64)
    emb = centres.repeat_interleave(3, dim=0)
    emb = emb + 0.05 * torch.randn(emb.shape, generator=generator, dtype=torch.float64)
    emb = torch.nn.functional.normalize(emb, dim=1)
    labels = torch.arange(4).repeat_interleave(3)
    value, grad = autograd(RankedListLoss(), emb, labels)
    assert value.item() == 0.0
    assert torch.count_nonzero(grad) == 0


def test_identical_embeddings_give_finite_value_and_gradient():
    emb = torch.nn.functional.normalize(torch.ones(12, 8, dtype=torch.float64), dim=1)
    labels = torch.arange(12) % 3
    value, grad = autograd(RankedListLoss(), emb, labels)
    # no positive is beyond 0.8; every negative is at ~0 < alpha: L_N = alpha per anchor
    assert value.item() == pytest.approx(1.2, rel=1e-5)
    assert torch.isfinite(grad).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_large_temperature_does_not_overflow(dtype):
    emb, labels = random_batch(24, 16, 4, seed=9)
    value, grad = autograd(RankedListLoss(temperature=1000.0), emb.to(dtype), labels)
    assert torch.isfinite(value) and torch.isfinite(grad).all()
    ref_value, ref_grad = reference_rll(emb, labels, temperature=1000.0)
    tolerance = 1e-6 if dtype == torch.float64 else 1e-4
    assert value.item() == pytest.approx(ref_value, rel=tolerance)
    torch.testing.assert_close(grad.to(torch.float64), ref_grad, rtol=tolerance, atol=1e-6)


def test_temperature_to_infinity_is_hardest_negative_mining():
    # Sec. 3.2: "If T = +inf, it becomes the hardest negative example mining"
    emb, labels = random_batch(16, 8, 4, seed=10)
    hard = RankedListLoss(margin=1.2, temperature=1e6, lam=1.0)(emb, labels).item()
    dist = torch.cdist(emb, emb)
    negative = labels[:, None] != labels[None, :]
    nearest = dist.masked_fill(~negative, float("inf")).amin(dim=1)
    expected = (1.2 - nearest).clamp(min=0).mean().item()  # alpha - m = 0: L_P adds d+
    positive = (labels[:, None] == labels[None, :]) & ~torch.eye(16, dtype=torch.bool)
    expected += ((dist * positive).sum(1) / positive.sum(1)).mean().item()
    assert hard == pytest.approx(expected, rel=1e-9)


def test_no_python_loop_over_anchors():
    assert_no_python_loop_over_anchors(RankedListLoss())


def test_float32_agrees_with_float64():
    assert_float32_agrees_with_float64(RankedListLoss(temperature=10.0))
