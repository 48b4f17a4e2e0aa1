"""The proxy baselines (Proxy Anchor, NormSoftmax, ArcFace) against loops over the papers'
equations in float64; their proxies are their own parameters, receive gradient and survive a
state_dict round trip; labels are mapped to proxy rows."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from nearsight.training.losses import build_loss
from nearsight.training.losses.registry import LossConfigError

PROXY_LOSSES = ["proxyanchor", "normsoftmax", "arcface"]


def batch(n: int = 12, dim: int = 6, classes: int = 4, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    emb = torch.randn(n, dim, generator=generator, dtype=torch.float64)
    labels = torch.arange(n) % classes
    return torch.nn.functional.normalize(emb, dim=1), labels[torch.randperm(n, generator=generator)]


def build(name: str, classes: int = 6, dim: int = 6, **params):
    torch.manual_seed(0)
    return build_loss(
        name, class_labels=list(range(classes)), embedding_size=dim, **params
    ).double()


def proxy_matrix(loss) -> torch.Tensor:
    """[C, D] unit proxies, whatever layout pytorch-metric-learning keeps them in."""
    inner = loss.loss
    raw = inner.proxies if hasattr(inner, "proxies") else inner.W.t()
    return torch.nn.functional.normalize(raw.detach(), dim=1)


def reference_proxy_anchor(emb, labels, proxies, alpha=32.0, delta=0.1) -> float:
    """Eq. 4 of Kim et al. 2020 with loops over proxies and embeddings."""
    classes = proxies.shape[0]
    positive_total, negative_total, with_positive = 0.0, 0.0, 0
    for c in range(classes):
        pos = [float(emb[i] @ proxies[c]) for i in range(len(labels)) if labels[i] == c]
        neg = [float(emb[i] @ proxies[c]) for i in range(len(labels)) if labels[i] != c]
        if pos:
            with_positive += 1
            positive_total += math.log1p(sum(math.exp(-alpha * (s - delta)) for s in pos))
        negative_total += math.log1p(sum(math.exp(alpha * (s + delta)) for s in neg))
    return positive_total / with_positive + negative_total / classes


def reference_cross_entropy(logits_of) -> float:
    """Mean over the batch of -log softmax(logits)[y]; ``logits_of(i)`` gives (logits, y)."""
    total, count = 0.0, 0
    for logits, target in logits_of:
        top = max(logits)
        log_z = top + math.log(sum(math.exp(z - top) for z in logits))
        total += log_z - logits[target]
        count += 1
    return total / count


def test_proxy_anchor_matches_eq_4():
    emb, labels = batch()
    loss = build("proxyanchor")  # 6 classes, the batch holds 4: two proxies without positives
    expected = reference_proxy_anchor(emb, labels, proxy_matrix(loss))
    assert loss(emb, labels).item() == pytest.approx(expected, rel=1e-9)


def test_normsoftmax_matches_a_temperature_softmax_over_cosines():
    emb, labels = batch(seed=1)
    loss = build("normsoftmax", temperature=0.1)
    proxies = proxy_matrix(loss)
    expected = reference_cross_entropy(
        ([float(emb[i] @ proxies[c]) / 0.1 for c in range(6)], int(labels[i]))
        for i in range(len(labels))
    )
    assert loss(emb, labels).item() == pytest.approx(expected, rel=1e-9)


def test_arcface_matches_an_additive_angular_margin_softmax():
    emb, labels = batch(seed=2)
    loss = build("arcface", margin=28.6, scale=16.0)
    proxies, margin = proxy_matrix(loss), math.radians(28.6)

    def logits(i: int) -> tuple[list[float], int]:
        y = int(labels[i])
        out = []
        for c in range(6):
            cosine = float(emb[i] @ proxies[c])
            if c == y:
                theta = math.acos(max(-1.0, min(1.0, cosine)))
                # past pi - m the paper's cos(theta + m) would rise again: fall back (as PML)
                cosine = (
                    math.cos(theta + margin)
                    if theta <= math.pi - margin
                    else cosine - margin * math.sin(margin)
                )
            out.append(16.0 * cosine)
        return out, y

    expected = reference_cross_entropy(logits(i) for i in range(len(labels)))
    assert loss(emb, labels).item() == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("name", PROXY_LOSSES)
def test_proxies_are_the_only_parameters_and_receive_gradient(name):
    loss = build(name)
    params = list(loss.parameters())
    assert len(params) == 1 and params[0].numel() == 6 * 6
    emb, labels = batch(seed=3)
    emb.requires_grad_(True)
    loss(emb, labels).backward()
    assert params[0].grad is not None and params[0].grad.abs().sum() > 0
    assert torch.isfinite(params[0].grad).all()
    assert emb.grad is not None and emb.grad.abs().sum() > 0


@pytest.mark.parametrize("name", PROXY_LOSSES)
def test_state_dict_round_trip_restores_the_proxies(name):
    loss = build(name)
    emb, labels = batch(seed=4)
    optimizer = torch.optim.SGD(loss.parameters(), lr=0.5)
    loss(emb, labels).backward()
    optimizer.step()  # the proxies have moved from their initialisation
    saved = copy.deepcopy(loss.state_dict())
    assert list(saved) == [key for key, _ in loss.named_parameters()]
    torch.manual_seed(123)
    restored = build_loss(name, class_labels=list(range(6)), embedding_size=6).double()
    assert restored(emb, labels).item() != pytest.approx(loss(emb, labels).item())
    restored.load_state_dict(saved)
    assert restored(emb, labels).item() == loss(emb, labels).item()


@pytest.mark.parametrize("name", PROXY_LOSSES)
def test_labels_are_mapped_to_proxy_rows(name):
    emb, labels = batch(seed=5)
    plain = build(name)
    torch.manual_seed(0)
    shifted = build_loss(
        name, class_labels=[105, 101, 103, 100, 102, 104], embedding_size=6
    ).double()
    assert shifted(emb, labels + 100).item() == plain(emb, labels).item()
    with pytest.raises(LossConfigError, match="no proxy"):
        shifted(emb, labels)


@pytest.mark.parametrize("name", PROXY_LOSSES)
def test_bad_construction_is_a_clear_error(name):
    with pytest.raises(LossConfigError):
        build_loss(name, class_labels=[0], embedding_size=6)
    with pytest.raises(LossConfigError):
        build_loss(name, class_labels=[0, 1], embedding_size=0)
    with pytest.raises(LossConfigError, match="needs parameter"):
        build_loss(name)


@pytest.mark.parametrize("name", PROXY_LOSSES)
def test_proxies_declare_a_joint_parameter_group(name):
    loss = build(name)
    assert loss.parameter_role == "joint"
    (group,) = loss.parameter_groups()
    assert group["name"] == f"{name}_proxies"
    assert [id(p) for p in group["params"]] == [id(p) for p in loss.parameters()]
