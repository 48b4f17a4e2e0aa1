"""Frozen BatchNorm statistics trained as an affine map (nearsight/models/frozen_norm.py): the
same outputs, gradients and state as PyTorch's eval-mode BatchNorm2d, in float32 and bf16."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from nearsight.models.embedding import EmbeddingConfig, EmbeddingNet
from nearsight.models.frozen_norm import FrozenStatsBatchNorm2d


def _calibrated(net: EmbeddingNet) -> EmbeddingNet:
    """Running statistics of real activations and affine weights away from their initial
    values, as after pretraining: a few batches through batch-statistics BatchNorm."""
    generator = torch.Generator().manual_seed(3)
    norms = [m for m in net.trunk.modules() if isinstance(m, nn.BatchNorm2d)]
    with torch.no_grad():
        for module in norms:
            c = module.num_features
            module.weight.copy_(torch.rand(c, generator=generator) + 0.5)
            module.bias.copy_(torch.randn(c, generator=generator) * 0.1)
            module.momentum = None  # a cumulative average of the calibration batches
            module.train()
        for _ in range(3):
            net.trunk(torch.rand(8, 3, 64, 64, generator=generator))
    net.train()  # freezes them again
    return net


def _reference(net: EmbeddingNet) -> EmbeddingNet:
    """The same network with PyTorch's own BatchNorm2d held in eval mode (the earlier code)."""
    ref = copy.deepcopy(net)
    for module in ref.trunk.modules():
        if isinstance(module, FrozenStatsBatchNorm2d):
            module.__class__ = nn.BatchNorm2d
    ref.config.freeze_bn = False
    ref.train()
    for module in ref.trunk.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.eval()
    return ref


@pytest.fixture(scope="module")
def frozen_pair() -> tuple[EmbeddingNet, EmbeddingNet]:
    torch.manual_seed(0)
    net = EmbeddingNet(EmbeddingConfig(arch="resnet18", dim=8, freeze_bn=True))
    net.train()
    net = _calibrated(net)
    return net, _reference(net)


def _step(net: EmbeddingNet, images: torch.Tensor, bf16: bool) -> tuple[torch.Tensor, dict]:
    net.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = net(images)
    weights = torch.linspace(-1, 1, out.numel()).view_as(out)
    (out.float() * weights).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in net.named_parameters() if p.grad is not None}
    return out.detach().float(), grads


def test_training_takes_the_affine_path_and_eval_the_plain_one(frozen_pair):
    net, _ = frozen_pair
    norms = [m for m in net.trunk.modules() if isinstance(m, nn.BatchNorm2d)]
    assert norms and all(type(m) is FrozenStatsBatchNorm2d for m in norms)
    net.train()
    assert all(m.affine_while_training and not m.training for m in norms)
    net.eval()
    assert not any(m.affine_while_training for m in norms)
    net.train()


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def test_float32_forward_and_gradients_equal_eval_mode_batch_norm(frozen_pair):
    net, ref = frozen_pair
    images = torch.rand(4, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    out, grads = _step(net, images, bf16=False)
    out_ref, grads_ref = _step(ref, images, bf16=False)
    assert _relative(out, out_ref) <= 1e-5
    assert grads.keys() == grads_ref.keys() and len(grads) > 60
    for name, grad in grads.items():
        assert _relative(grad, grads_ref[name]) <= 1e-4, name  # rounding through 20 layers


def test_bf16_stays_within_bf16s_own_error(frozen_pair):
    """Under bf16 autocast both paths round: the affine one may stray from float32 no further
    than eval-mode batch norm does, give or take a half."""
    net, ref = frozen_pair
    images = torch.rand(4, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    out32, grads32 = _step(ref, images, bf16=False)
    out_ref, grads_ref = _step(ref, images, bf16=True)
    out, grads = _step(net, images, bf16=True)
    assert _relative(out, out32) <= 1.5 * _relative(out_ref, out32) + 1e-3
    for name in ("trunk.conv1.weight", "trunk.layer2.0.bn1.weight", "embedding.weight"):
        noise = _relative(grads_ref[name], grads32[name])
        assert _relative(grads[name], grads32[name]) <= 1.5 * noise + 1e-3, name


def test_statistics_stay_frozen_and_state_dict_keys_unchanged(frozen_pair):
    net, ref = frozen_pair
    # the trunk's: the head's feature_norm (from scratch) keeps learning its statistics
    before = {k: v.clone() for k, v in net.state_dict().items() if k.startswith("trunk.")}
    _step(net, torch.rand(2, 3, 32, 32), bf16=False)
    after = net.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert list(net.state_dict()) == list(ref.state_dict())


def test_inference_is_bit_identical_to_batch_norm(frozen_pair):
    net, ref = frozen_pair
    images = torch.rand(3, 3, 48, 48, generator=torch.Generator().manual_seed(2))
    ref.load_state_dict(net.state_dict())  # the head's statistics moved in the steps above
    net.eval()
    ref.eval()
    with torch.no_grad():
        assert torch.equal(net(images), ref(images))
    net.train()
