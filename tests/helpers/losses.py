"""Loss tests: random batches, autograd, and the checks every seed loss passes."""

from __future__ import annotations

import sys
from typing import Any

import pytest


def random_batch(n: int, dim: int, classes: int, seed: int) -> tuple[Any, Any]:
    """``n`` unit float64 embeddings of ``dim`` and shuffled labels of ``classes`` classes."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    emb = torch.randn(n, dim, generator=generator, dtype=torch.float64)
    emb = torch.nn.functional.normalize(emb, dim=1)
    labels = torch.arange(n) % classes
    labels = labels[torch.randperm(n, generator=generator)]
    return emb, labels


def autograd(loss_fn, emb, labels):
    """(loss value, its gradient with respect to ``emb``)."""
    import torch

    emb = emb.clone().requires_grad_(True)
    value = loss_fn(emb, labels)
    (grad,) = torch.autograd.grad(value, emb)
    return value, grad


def count_python_calls(fn) -> int:
    """Python function calls made while ``fn()`` runs."""
    calls = 0

    def profiler(frame, event, arg):
        nonlocal calls
        if event == "call":
            calls += 1

    sys.setprofile(profiler)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def assert_no_python_loop_over_anchors(loss) -> None:
    """Whole-batch tensor code: a batch 10x larger makes no more Python calls."""
    counts = []
    for n in (16, 160):
        emb, labels = random_batch(n, 8, n // 4, seed=0)
        emb.requires_grad_(True)
        loss(emb, labels)  # warm-up: lazy imports happen once
        counts.append(count_python_calls(lambda emb=emb, labels=labels: loss(emb, labels)))
    assert counts[0] == counts[1], counts


def assert_float32_agrees_with_float64(loss) -> None:
    """Training runs in float32: the same batch gives the same loss and gradient."""
    import torch

    emb, labels = random_batch(24, 16, 6, seed=21)
    value64, grad64 = autograd(loss, emb, labels)
    value32, grad32 = autograd(loss, emb.float(), labels)
    assert value32.dtype == torch.float32 and grad32.dtype == torch.float32
    assert value32.item() == pytest.approx(value64.item(), rel=1e-4)
    torch.testing.assert_close(grad32.double(), grad64, rtol=1e-3, atol=1e-5)
