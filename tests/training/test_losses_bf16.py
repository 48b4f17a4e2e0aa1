"""Every seed loss on bf16 embeddings and under bf16 autocast, against float32, on the CPU.

On CUDA the trainer runs the network under bf16 autocast; a loss may then be handed bf16
embeddings or be called inside an autocast region. Each loss computes in float32 then
(``_pairs.float32_loss``), so: on bf16 inputs it gives the float32 result of the same values;
under autocast it gives the float32 result exactly; and against the unrounded float32
embeddings it differs only by the rounding of its inputs (bf16 keeps 8 significant bits).
"""

from __future__ import annotations

import pytest
import torch

from nearsight.training.losses import build_loss

SEED_LOSSES = ("ice", "rll", "nra", "rankmi", "bcontrastive")


def make_loss(name: str) -> torch.nn.Module:
    torch.manual_seed(0)  # RankMI's statistics network: the same weights every time
    if name == "bcontrastive":
        return build_loss(name, class_counts={c: 20 for c in range(8)}, m=4, n=8)
    return build_loss(name)


def batch(name: str, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """L2-normalised float32 embeddings [N, 128] and labels in the loss's batch design."""
    generator = torch.Generator().manual_seed(seed)
    # (m, n)-group design: 8 classes x 4 images; m-per-class: 12 classes x 5 images
    labels = torch.arange(32) // 4 if name == "bcontrastive" else torch.arange(60) % 12
    # clustered by class, so margins, ranks and weights are neither all saturated nor all zero
    centres = torch.randn(int(labels.max()) + 1, 128, generator=generator)
    noise = torch.randn(len(labels), 128, generator=generator)
    embeddings = torch.nn.functional.normalize(centres[labels] + 1.5 * noise, dim=1)
    return embeddings, labels


def value_and_grad(
    name: str, embeddings: torch.Tensor, labels: torch.Tensor, autocast: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    leaf = embeddings.detach().clone().requires_grad_(True)
    context = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)
    with context:
        value = make_loss(name)(leaf, labels)
    value.backward()
    return value.detach(), leaf.grad.float()


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-12))


@pytest.mark.parametrize("name", SEED_LOSSES)
def test_bf16_inputs_give_the_float32_result_of_the_same_values(name):
    embeddings, labels = batch(name)
    rounded = embeddings.bfloat16()
    value, grad = value_and_grad(name, rounded, labels)
    ref_value, ref_grad = value_and_grad(name, rounded.float(), labels)
    assert value.dtype == torch.float32
    assert torch.isfinite(value)
    assert value.item() == pytest.approx(ref_value.item(), rel=1e-6, abs=1e-7)
    # the gradient reaches the bf16 leaf rounded to bf16: 2^-9 relative per entry
    assert relative(grad, ref_grad) < 4e-3


@pytest.mark.parametrize("name", SEED_LOSSES)
def test_bf16_autocast_leaves_the_loss_in_float32(name):
    embeddings, labels = batch(name)
    value, grad = value_and_grad(name, embeddings, labels, autocast=True)
    ref_value, ref_grad = value_and_grad(name, embeddings, labels)
    assert value.dtype == torch.float32
    assert value.item() == pytest.approx(ref_value.item(), rel=1e-6, abs=1e-7)
    assert relative(grad, ref_grad) < 1e-6


@pytest.mark.parametrize("name", SEED_LOSSES)
def test_bf16_embeddings_against_float32_embeddings(name):
    """What a bf16 network's rounding of its output costs: loss within 2%, gradient within
    10% in norm and pointing the same way (cosine > 0.99)."""
    embeddings, labels = batch(name)
    value, grad = value_and_grad(name, embeddings.bfloat16(), labels)
    ref_value, ref_grad = value_and_grad(name, embeddings, labels)
    assert value.item() == pytest.approx(ref_value.item(), rel=2e-2, abs=1e-4)
    assert relative(grad, ref_grad) < 0.1
    cosine = torch.nn.functional.cosine_similarity(grad.flatten(), ref_grad.flatten(), dim=0)
    assert cosine > 0.99


def test_float64_inputs_stay_float64():
    """The loop references of the other loss tests run in float64: no downcast."""
    embeddings, labels = batch("rll")
    value = make_loss("rll")(embeddings.double(), labels)
    assert value.dtype == torch.float64


def test_rankmi_critic_loss_under_autocast_is_float32():
    embeddings, labels = batch("rankmi")
    loss = make_loss("rankmi")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = loss.critic_loss(embeddings.bfloat16(), labels)
    reference = make_loss("rankmi").critic_loss(embeddings.bfloat16().float(), labels)
    assert value.dtype == torch.float32
    assert value.item() == pytest.approx(reference.item(), rel=1e-6)
