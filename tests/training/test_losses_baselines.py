"""The six pytorch-metric-learning baselines behind nearsight's interface."""

from __future__ import annotations

import math

import pytest
import torch
from pytorch_metric_learning import distances, losses, miners

from nearsight.training.losses.contrastive import ContrastiveLoss
from nearsight.training.losses.lifted import LiftedStructureLoss
from nearsight.training.losses.margin import MarginLoss
from nearsight.training.losses.multisimilarity import MultiSimilarityLoss
from nearsight.training.losses.npairs import NPairsLoss
from nearsight.training.losses.registry import build_loss
from nearsight.training.losses.triplet import SemiHardTripletLoss

BASELINES = ["contrastive", "triplet", "margin", "multisimilarity", "lifted", "npairs"]


def random_batch(n: int, dim: int, classes: int, seed: int, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    emb = torch.randn(n, dim, generator=generator, dtype=dtype)
    emb = torch.nn.functional.normalize(emb, dim=1)
    labels = torch.arange(n) % classes
    return emb, labels[torch.randperm(n, generator=generator)]


def separated_batch(copies: int = 3, classes: int = 4, dim: int = 8):
    """Each class is ``copies`` identical unit vectors; classes are orthogonal (d = sqrt 2)."""
    emb = torch.eye(classes, dim, dtype=torch.float64).repeat_interleave(copies, dim=0)
    return emb, torch.arange(classes).repeat_interleave(copies)


def pml_reference(name: str):
    """pytorch-metric-learning called directly, configured as nearsight's defaults say."""
    lp = distances.LpDistance(normalize_embeddings=False)
    dot = distances.DotProductSimilarity(normalize_embeddings=False)
    if name == "contrastive":
        loss = losses.ContrastiveLoss(pos_margin=0.0, neg_margin=1.0, distance=lp)
        return lambda e, y: loss(e, y)
    if name == "triplet":
        miner = miners.TripletMarginMiner(margin=0.2, type_of_triplets="semihard", distance=lp)
        loss = losses.TripletMarginLoss(margin=0.2, distance=lp)
        return lambda e, y: loss(e, y, miner(e, y))
    if name == "margin":
        miner = miners.DistanceWeightedMiner(cutoff=0.5, nonzero_loss_cutoff=1.4)
        loss = losses.MarginLoss(margin=0.2, beta=1.2, distance=lp)
        return lambda e, y: loss(e, y, miner(e, y))
    if name == "multisimilarity":
        miner = miners.MultiSimilarityMiner(epsilon=0.1, distance=dot)
        loss = losses.MultiSimilarityLoss(alpha=2, beta=50, base=0.5, distance=dot)
        return lambda e, y: loss(e, y, miner(e, y))
    if name == "lifted":
        loss = losses.LiftedStructureLoss(neg_margin=1.0, pos_margin=0.0, distance=lp)
        return lambda e, y: loss(e, y)
    if name == "npairs":
        loss = losses.NPairsLoss(distance=dot)
        return lambda e, y: loss(e, y)
    raise AssertionError(name)


@pytest.mark.parametrize("name", BASELINES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_returns_a_finite_scalar_with_a_gradient(name, dtype):
    torch.manual_seed(0)
    emb, labels = random_batch(24, 16, 6, seed=1, dtype=dtype)
    emb.requires_grad_(True)
    value = build_loss(name)(emb, labels)
    assert value.shape == () and value.dtype == dtype and torch.isfinite(value)
    value.backward()
    assert torch.isfinite(emb.grad).all() and emb.grad.abs().sum() > 0


@pytest.mark.parametrize("name", BASELINES)
@pytest.mark.parametrize("seed", [2, 3])
def test_matches_pytorch_metric_learning_called_directly(name, seed):
    emb, labels = random_batch(20, 8, 5, seed=seed)
    ours_emb = emb.clone().requires_grad_(True)
    torch.manual_seed(seed)  # the margin loss's negative sampling draws from it
    ours = build_loss(name)(ours_emb, labels)
    ours.backward()
    pml_emb = emb.clone().requires_grad_(True)
    torch.manual_seed(seed)
    direct = pml_reference(name)(pml_emb, labels)
    direct.backward()
    assert ours.item() == pytest.approx(direct.item(), rel=1e-12)
    assert ours.item() > 0
    torch.testing.assert_close(ours_emb.grad, pml_emb.grad, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", ["contrastive", "triplet", "margin", "multisimilarity"])
def test_zero_on_a_batch_that_satisfies_the_loss(name):
    # positives coincide (d = 0), negatives at sqrt(2): beyond the contrastive neg_margin 1,
    # no semi-hard triplet, no negative under the margin loss's 1.4 cut-off, no MS pair mined
    emb, labels = separated_batch()
    emb.requires_grad_(True)
    torch.manual_seed(0)
    value = build_loss(name)(emb, labels)
    assert value.item() == 0.0
    value.backward()
    assert torch.isfinite(emb.grad).all()


@pytest.mark.parametrize("name", BASELINES)
def test_identical_embeddings_give_finite_value_and_gradient(name):
    emb = torch.nn.functional.normalize(torch.ones(12, 8, dtype=torch.float64), dim=1)
    emb.requires_grad_(True)
    labels = torch.arange(12) % 3
    torch.manual_seed(0)
    value = build_loss(name)(emb, labels)
    assert torch.isfinite(value)
    value.backward()
    assert torch.isfinite(emb.grad).all()


@pytest.mark.parametrize("name", BASELINES)
def test_class_with_one_image_is_handled(name):
    emb, labels = random_batch(13, 8, 4, seed=4)
    labels = labels.clone()
    labels[0] = 99
    emb.requires_grad_(True)
    torch.manual_seed(0)
    value = build_loss(name)(emb, labels)
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(emb.grad).all()


def unit(degrees: float) -> list[float]:
    return [math.cos(math.radians(degrees)), math.sin(math.radians(degrees))]


def chord(degrees: float) -> float:
    return 2 * math.sin(math.radians(degrees) / 2)


def test_contrastive_hand_computed():
    emb = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]], dtype=torch.float64)
    labels = torch.tensor([0, 0, 1])
    value = ContrastiveLoss()(emb, labels).item()
    # positive pairs: d_01 = sqrt 2 (both orders); negatives under the margin 1:
    # d_02 = sqrt(0.8), d_12 = sqrt(0.4); each term averaged over its non-zero pairs
    expected = math.sqrt(2) + ((1 - math.sqrt(0.8)) + (1 - math.sqrt(0.4))) / 2
    assert value == pytest.approx(expected, rel=1e-12)


def test_semi_hard_triplet_hand_computed():
    # anchor at 0 deg, positive at 40, negative at -50: d_ap < d_an < d_ap + 0.2 (semi-hard);
    # from the positive as anchor the negative is too far (not mined)
    emb = torch.tensor([unit(0), unit(40), unit(-50)], dtype=torch.float64)
    value = SemiHardTripletLoss()(emb, torch.tensor([0, 0, 1])).item()
    assert value == pytest.approx(chord(40) - chord(50) + 0.2, rel=1e-12)


def test_lifted_hand_computed():
    emb = torch.tensor([unit(0), unit(40), unit(-50)], dtype=torch.float64)
    value = LiftedStructureLoss()(emb, torch.tensor([0, 0, 1])).item()
    # one positive pair (0, 1); its negatives: 2 from both ends
    j = math.log(math.exp(1 - chord(50)) + math.exp(1 - chord(90))) + chord(40)
    assert value == pytest.approx(max(j, 0.0) ** 2 / 2, rel=1e-12)


def test_multisimilarity_hand_computed():
    # one anchor pair; everything mined when the positive is no more similar than the negative
    emb = torch.tensor([unit(0), unit(60), unit(30)], dtype=torch.float64)
    labels = torch.tensor([0, 0, 1])
    value = MultiSimilarityLoss()(emb, labels).item()
    s_pos, s_neg = math.cos(math.radians(60)), math.cos(math.radians(30))

    def anchor_loss(sp: float, sn: float) -> float:
        return (
            math.log1p(math.exp(-2 * (sp - 0.5))) / 2 + math.log1p(math.exp(50 * (sn - 0.5))) / 50
        )

    # anchors 0 and 1 each: positive S = 0.5, negative S = cos 30; anchor 2 has no positive
    # but its negatives (S = cos 30 each) are mined against... nothing: no positive, no term
    expected = (anchor_loss(s_pos, s_neg) * 2) / 3
    assert value == pytest.approx(expected, rel=1e-12)


def test_npairs_hand_computed():
    emb = torch.tensor([unit(0), unit(20), unit(90), unit(120)], dtype=torch.float64)
    labels = torch.tensor([0, 0, 1, 1])
    value = NPairsLoss()(emb, labels).item()

    # pairs (0, 1) and (2, 3): softmax cross entropy of f_i . f_j+ over j
    def ce(anchor: float, positive: float, other: float) -> float:
        s_p = math.cos(math.radians(positive - anchor))
        s_o = math.cos(math.radians(other - anchor))
        return math.log1p(math.exp(s_o - s_p))

    expected = (ce(0, 20, 120) + ce(90, 120, 20)) / 2
    assert value == pytest.approx(expected, rel=1e-12)


def test_margin_loss_public_parameters_reach_pml():
    loss = MarginLoss(margin=0.3, beta=1.1, cutoff=0.6, nonzero_loss_cutoff=1.3)
    assert loss.loss.margin == 0.3 and loss.beta == pytest.approx(1.1)
    assert loss.miner.cutoff == 0.6 and loss.miner.nonzero_loss_cutoff == 1.3
    learned = MarginLoss(learn_beta=True)
    assert [p.numel() for p in learned.parameters()] == [1]
    assert list(MarginLoss().parameters()) == []
