"""ICE (nearsight/training/losses/ice.py) against a loop reference written from the paper's equations."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import assert_no_python_loop_over_anchors, autograd, random_batch

from nearsight.training.losses.ice import InstanceCrossEntropyLoss


def reference_ice(emb: torch.Tensor, labels: torch.Tensor, scale: float, symmetric: bool):
    """Loops over anchors, positives and negatives, straight from eqs. 3-5, 13-15.

    Returns (loss value, gradient w.r.t. emb, wt_pos dict, wt_neg dict)."""
    n = emb.shape[0]
    f = emb.tolist()

    def dot(u, v):
        return sum(a * b for a, b in zip(u, v, strict=True))

    grad = torch.zeros_like(emb)
    wt_pos: dict[tuple[int, int], float] = {}
    wt_neg: dict[tuple[int, int], float] = {}
    total_log = 0.0
    for a in range(n):
        pos = [j for j in range(n) if j != a and labels[j] == labels[a]]
        neg = [j for j in range(n) if labels[j] != labels[a]]
        if not pos:
            continue
        w_ap = {}
        big_w_an = dict.fromkeys(neg, 0.0)
        nll = 0.0
        for p in pos:
            denominator = math.exp(scale * dot(f[a], f[p])) + sum(
                math.exp(scale * dot(f[a], f[k])) for k in neg
            )
            p_match = math.exp(scale * dot(f[a], f[p])) / denominator
            w_ap[p] = 1.0 - p_match
            nll += -math.log(p_match)
            for k in neg:
                big_w_an[k] += math.exp(scale * dot(f[a], f[k])) / denominator
        total_log += nll / len(pos)
        sum_w_ap = sum(w_ap.values())
        sum_w_an = sum(big_w_an.values())
        for p in pos:
            wt = (w_ap[p] / sum_w_ap / n) if sum_w_ap > 0 else 0.0
            wt_pos[a, p] = wt
            grad[p] -= wt * emb[a]  # eq. 15
            if symmetric:
                grad[a] -= wt * emb[p]
        for k in neg:
            wt = (big_w_an[k] / sum_w_an / n) if sum_w_an > 0 else 0.0
            wt_neg[a, k] = wt
            grad[k] += wt * emb[a]  # eq. 15
            if symmetric:
                grad[a] += wt * emb[k]
    return total_log / n, grad, wt_pos, wt_neg


@pytest.mark.parametrize(
    ("n", "dim", "classes", "scale", "seed"),
    [(12, 8, 3, 8.0, 0), (18, 16, 6, 16.0, 1), (24, 12, 5, 64.0, 2), (20, 8, 4, 1.0, 3)],
)
@pytest.mark.parametrize("symmetric", [False, True])
def test_value_and_gradient_match_loop_reference(n, dim, classes, scale, seed, symmetric):
    emb, labels = random_batch(n, dim, classes, seed)
    loss = InstanceCrossEntropyLoss(scale=scale, symmetric=symmetric)
    value, grad = autograd(loss, emb, labels)
    ref_value, ref_grad, ref_pos, ref_neg = reference_ice(emb, labels, scale, symmetric)
    assert value.item() == pytest.approx(ref_value, rel=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-12)
    wt_pos, wt_neg, _ = loss.weights(emb, labels)
    for (a, p), wt in ref_pos.items():
        assert wt_pos[a, p].item() == pytest.approx(wt, rel=1e-6, abs=1e-15)
    for (a, k), wt in ref_neg.items():
        assert wt_neg[a, k].item() == pytest.approx(wt, rel=1e-6, abs=1e-15)


def test_positive_and_negative_weights_each_sum_to_one_over_n_per_anchor():
    emb, labels = random_batch(20, 8, 4, seed=5)
    wt_pos, wt_neg, _ = InstanceCrossEntropyLoss(scale=64).weights(emb, labels)
    torch.testing.assert_close(wt_pos.sum(1), torch.full((20,), 1 / 20, dtype=torch.float64))
    torch.testing.assert_close(wt_neg.sum(1), torch.full((20,), 1 / 20, dtype=torch.float64))


def test_two_images_per_class_gives_the_papers_simplified_weights():
    # Sec. 3.5, eqs. 16-17: wt_ap = 1/N and wt_an = (1/N) softmax_n(s S_an)
    n, scale = 16, 10.0
    generator = torch.Generator().manual_seed(7)
    emb = torch.nn.functional.normalize(
        torch.randn(n, 8, generator=generator, dtype=torch.float64), dim=1
    )
    labels = torch.arange(n) // 2
    wt_pos, wt_neg, _ = InstanceCrossEntropyLoss(scale=scale).weights(emb, labels)
    for a in range(n):
        p = a ^ 1  # the other image of the pair
        assert wt_pos[a, p].item() == pytest.approx(1 / n, rel=1e-12)
        negatives = [k for k in range(n) if labels[k] != labels[a]]
        logits = torch.tensor([scale * float(emb[a] @ emb[k]) for k in negatives])
        expected = torch.softmax(logits, dim=0) / n
        torch.testing.assert_close(wt_neg[a, negatives], expected.to(torch.float64))


def test_gradient_is_eq_15_not_the_gradient_of_the_logged_value():
    # the surrogate reads as L_log but its gradient is eq. 15, which differs from d L_log / df
    emb, labels = random_batch(12, 8, 3, seed=11)
    loss = InstanceCrossEntropyLoss(scale=8.0)
    value, grad = autograd(loss, emb, labels)
    leaf = emb.clone().requires_grad_(True)
    s = 8.0 * leaf @ leaf.t()
    positive = (labels[:, None] == labels[None, :]) & ~torch.eye(12, dtype=torch.bool)
    negative = labels[:, None] != labels[None, :]
    lse_neg = torch.logsumexp(s.masked_fill(~negative, float("-inf")), dim=1, keepdim=True)
    nll = -(s - torch.logaddexp(s, lse_neg))
    direct = ((nll * positive).sum(1) / positive.sum(1)).sum() / 12
    assert value.item() == pytest.approx(direct.item(), rel=1e-10)
    (direct_grad,) = torch.autograd.grad(direct, leaf)
    assert not torch.allclose(grad, direct_grad, rtol=1e-3)


def test_anchor_alone_in_its_class_contributes_nothing():
    emb, labels = random_batch(13, 8, 4, seed=4)
    labels = labels.clone()
    labels[0] = 99  # singleton class: no positive for anchor 0
    value, grad = autograd(InstanceCrossEntropyLoss(scale=16.0), emb, labels)
    ref_value, ref_grad, _, _ = reference_ice(emb, labels, 16.0, symmetric=False)
    assert torch.isfinite(value) and torch.isfinite(grad).all()
    assert value.item() == pytest.approx(ref_value, rel=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-12)
    wt_pos, wt_neg, nll = InstanceCrossEntropyLoss(scale=16.0).weights(emb, labels)
    assert wt_pos[0].abs().sum() == 0 and wt_neg[0].abs().sum() == 0 and nll[0] == 0


def test_every_image_in_its_own_class_gives_zero_loss_and_gradient():
    emb, _ = random_batch(10, 8, 10, seed=4)
    value, grad = autograd(InstanceCrossEntropyLoss(), emb, torch.arange(10))
    assert value.item() == 0.0
    assert torch.count_nonzero(grad) == 0


def test_single_class_batch_has_no_negatives_and_zero_loss():
    emb, _ = random_batch(8, 8, 1, seed=4)
    value, grad = autograd(InstanceCrossEntropyLoss(), emb, torch.zeros(8, dtype=torch.long))
    assert value.item() == 0.0  # p_s(p|a) = 1: nothing to match against
    assert torch.count_nonzero(grad) == 0


def test_well_separated_batch_has_near_zero_loss_and_finite_gradient():
    # two classes at opposite poles: p_s(p|a) ~ 1 for every pair at s = 64
    base = torch.nn.functional.normalize(torch.randn(1, 8, dtype=torch.float64), dim=1)
    emb = torch.cat([base.repeat(3, 1), -base.repeat(3, 1)])
    emb = torch.nn.functional.normalize(emb + 1e-3 * torch.randn_like(emb), dim=1)
    labels = torch.tensor([0, 0, 0, 1, 1, 1])
    value, grad = autograd(InstanceCrossEntropyLoss(scale=64.0), emb, labels)
    assert 0.0 <= value.item() < 1e-40
    assert torch.isfinite(grad).all()


def test_identical_embeddings_give_finite_value_and_gradient():
    emb = torch.nn.functional.normalize(torch.ones(12, 8, dtype=torch.float64), dim=1)
    labels = torch.arange(12) % 3
    value, grad = autograd(InstanceCrossEntropyLoss(scale=64.0), emb, labels)
    # every similarity equal: p_s(p|a) = 1 / (1 + |N_a|) = 1/9
    assert value.item() == pytest.approx(math.log(9.0), rel=1e-12)
    assert torch.isfinite(grad).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_large_scale_does_not_overflow(dtype):
    emb, labels = random_batch(24, 16, 4, seed=9)
    emb = emb.to(dtype)
    value, grad = autograd(InstanceCrossEntropyLoss(scale=1000.0), emb, labels)
    assert torch.isfinite(value) and torch.isfinite(grad).all()
    if dtype == torch.float64:
        ref_value, ref_grad, _, _ = reference_ice_log_space(emb, labels, 1000.0)
        assert value.item() == pytest.approx(ref_value, rel=1e-6)
        torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-12)


def reference_ice_log_space(emb, labels, scale):
    """The loop reference with every sum of exponentials taken in log space (shifted by its
    largest term), for scales where exp(s S) overflows even in float64."""
    n = emb.shape[0]
    logits = (scale * emb @ emb.t()).tolist()

    def log_sum_exp(values):
        top = max(values)
        return top + math.log(sum(math.exp(v - top) for v in values))

    def normalise(log_weights):  # {key: log w} -> {key: w / sum w}
        total = log_sum_exp(list(log_weights.values()))
        return {key: math.exp(v - total) for key, v in log_weights.items()}

    grad = torch.zeros_like(emb)
    total_log = 0.0
    for a in range(n):
        pos = [j for j in range(n) if j != a and labels[j] == labels[a]]
        neg = [j for j in range(n) if labels[j] != labels[a]]
        row = logits[a]
        log_sum_neg = log_sum_exp([row[k] for k in neg])
        log_denominator = {p: log_sum_exp([row[p], log_sum_neg]) for p in pos}
        total_log += sum(log_denominator[p] - row[p] for p in pos) / len(pos)
        wt_pos = normalise({p: log_sum_neg - log_denominator[p] for p in pos})
        log_inverse = log_sum_exp([-log_denominator[p] for p in pos])
        wt_neg = normalise({k: row[k] + log_inverse for k in neg})
        for p in pos:
            grad[p] -= wt_pos[p] / n * emb[a]
        for k in neg:
            grad[k] += wt_neg[k] / n * emb[a]
    return total_log / n, grad, None, None


def test_no_python_loop_over_anchors():
    assert_no_python_loop_over_anchors(InstanceCrossEntropyLoss())


def test_no_gradient_reaches_the_anchor_unless_symmetric():
    # one anchor, one positive, one negative: only p and n move unless symmetric=True
    emb, _ = random_batch(3, 4, 3, seed=2)
    labels = torch.tensor([0, 0, 1])
    _, grad = autograd(InstanceCrossEntropyLoss(scale=4.0), emb, labels)
    _, ref_grad, _, _ = reference_ice(emb, labels, 4.0, symmetric=False)
    torch.testing.assert_close(grad, ref_grad)
    # anchor 0's own gradient comes only from being a positive/negative of the other anchors
    _, sym_grad = autograd(InstanceCrossEntropyLoss(scale=4.0, symmetric=True), emb, labels)
    assert not torch.allclose(grad[0], sym_grad[0])


def test_float32_agrees_with_float64():
    # training runs in float32: the same batch must give the same loss and gradient
    emb, labels = random_batch(24, 16, 6, seed=21)
    loss = InstanceCrossEntropyLoss(scale=64.0)
    value64, grad64 = autograd(loss, emb, labels)
    value32, grad32 = autograd(loss, emb.float(), labels)
    assert value32.dtype == torch.float32 and grad32.dtype == torch.float32
    assert value32.item() == pytest.approx(value64.item(), rel=1e-4)
    torch.testing.assert_close(grad32.double(), grad64, rtol=1e-3, atol=1e-5)
