"""The multi-level loss: the sum over heads, each head with its own loss instance."""

from __future__ import annotations

import pytest
import torch

from nearsight.training.losses import build_loss
from nearsight.training.losses.multihead import PerHeadLoss


def heads_batch(n: int = 12, dim: int = 6, heads: int = 3, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    embeddings = [
        torch.nn.functional.normalize(
            torch.randn(n, dim, generator=generator, dtype=torch.float64), dim=1
        ).requires_grad_(True)
        for _ in range(heads)
    ]
    return embeddings, torch.arange(n) // 3


@pytest.mark.parametrize("name", ["ice", "rll", "nra"])
def test_value_and_gradients_are_the_sum_over_heads(name):
    embeddings, labels = heads_batch()
    loss = PerHeadLoss([build_loss(name) for _ in range(3)])
    total = loss(embeddings, labels)
    grads = torch.autograd.grad(total, embeddings)
    # the reference: each head's loss on its own (fresh leaves), added up in float64
    expected, expected_grads = 0.0, []
    for head in embeddings:
        leaf = head.detach().clone().requires_grad_(True)
        value = build_loss(name)(leaf, labels)
        (grad,) = torch.autograd.grad(value, leaf)
        expected += value.item()
        expected_grads.append(grad)
    assert total.item() == pytest.approx(expected, rel=1e-12)
    for grad, reference in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, reference, rtol=1e-12, atol=1e-15)


def test_each_head_has_its_own_proxies():
    embeddings, labels = heads_batch()
    torch.manual_seed(0)
    loss = PerHeadLoss(
        [build_loss("proxyanchor", class_labels=range(4), embedding_size=6) for _ in range(3)]
    ).double()
    proxies = list(loss.parameters())
    assert len(proxies) == 3 and len({id(p) for p in proxies}) == 3
    loss(embeddings, labels).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in proxies)


def test_rankmi_alternation_runs_on_every_head():
    embeddings, labels = heads_batch(seed=1)
    loss = PerHeadLoss([build_loss("rankmi", seed=k) for k in range(3)]).double()
    assert loss.has_critic and loss.is_critic_step(1) and not loss.is_critic_step(0)
    detached = [e.detach() for e in embeddings]
    critic = loss.critic_loss(detached, labels)
    expected = sum(
        h.critic_loss(e, labels).item() for h, e in zip(loss.heads, detached, strict=True)
    )
    assert critic.item() == pytest.approx(expected, rel=1e-12)
    critic.backward()
    assert all(p.grad is not None for p in loss.parameters())
    betas = loss.update_beta()
    assert betas == loss.heads[-1].beta == loss.beta


def test_heads_and_losses_must_agree():
    embeddings, labels = heads_batch(heads=2)
    with pytest.raises(ValueError, match="2 heads"):
        PerHeadLoss([build_loss("ice") for _ in range(3)])(embeddings, labels)


def test_parameter_groups_are_named_by_head():
    loss = PerHeadLoss(
        [build_loss("normsoftmax", class_labels=range(4), embedding_size=6) for _ in range(3)]
    )
    assert loss.parameter_role == "joint"
    groups = loss.parameter_groups()
    assert [g["name"] for g in groups] == [f"head{k}_normsoftmax_proxies" for k in range(3)]
    assert PerHeadLoss([build_loss("ice")]).parameter_role == "none"
