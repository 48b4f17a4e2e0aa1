"""Ranking losses for deep metric learning, built by name.

>>> from nearsight.training.losses import build_loss
>>> loss = build_loss("rll", alpha=1.2, margin=0.4, temperature=10, lam=1.0)
>>> value = loss(embeddings, labels)  # scalar tensor

Each loss lives in its own module and is a ``torch.nn.Module`` called as
``loss(embeddings, labels)`` with L2-normalised ``embeddings`` [N, D] and integer ``labels`` [N].
The five seed losses follow docs/losses.md; the baselines wrap pytorch-metric-learning.
"""

from nearsight.training.losses.registry import LOSSES, build_loss, loss_parameters

__all__ = ["LOSSES", "build_loss", "loss_parameters"]
