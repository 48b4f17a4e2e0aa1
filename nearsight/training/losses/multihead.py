"""The loss of a multi-level network: the same loss on every head's embeddings, summed.

Papers: X. Wang et al., "Ranked List Loss for Deep Metric Learning", CVPR 2019, and "Instance
Cross Entropy for Deep Metric Learning", 2019: a 512-d head on three trunk levels (L, M, H),
each trained under the loss at once, the total the sum over heads (LOSSES.md, "Multi-level
embeddings"). Each head gets its own instance of the loss, so a loss with its own parameters
(RankMI's critic, the proxies) has one set per head: the heads are different spaces.

RankMI's alternation (Algorithm 1) runs on all heads together: one critic step updates every
head's statistics network on its own head's pairs, then every head's beta is re-estimated.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, cast

import torch
from torch import nn

from nearsight.training.loss_roles import CriticLoss, JointParameterLoss


class _WithBeta(Protocol):
    @property
    def beta(self) -> float: ...


class PerHeadLoss(nn.Module):
    """``loss([embeddings of head 1, ..., head H], labels) -> sum of the heads' losses``."""

    def __init__(self, losses: Sequence[nn.Module]) -> None:
        super().__init__()
        if not losses:
            raise ValueError("PerHeadLoss needs at least one head's loss")
        self.heads = nn.ModuleList(losses)

    def forward(self, embeddings: Sequence[torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        if len(embeddings) != len(self.heads):
            raise ValueError(f"{len(embeddings)} heads' embeddings for {len(self.heads)} losses")
        total = self.heads[0](embeddings[0], labels)
        for loss, head in zip(self.heads[1:], embeddings[1:], strict=True):
            total = total + loss(head, labels)
        return total

    @property
    def parameter_role(self) -> str:
        """The heads' loss's (nearsight/training/loss_roles.py)."""
        return getattr(self.heads[0], "parameter_role", "none")

    def parameter_groups(self) -> list[dict]:
        """Every head's groups, named by head (``head0_...``, low to high)."""
        return [
            {**group, "name": f"head{index}_{group.get('name', 'loss')}"}
            for index, loss in enumerate(self.heads)
            # parameter_role() checked each head's loss as a joint one (builders)
            for group in cast(JointParameterLoss, loss).parameter_groups()
        ]

    def logged_scalars(self) -> dict[str, float]:
        scalars = {}
        for index, loss in enumerate(self.heads):
            own = getattr(loss, "logged_scalars", None)
            if callable(own):
                scalars.update({f"head{index}_{k}": v for k, v in own().items()})
        return scalars

    # RankMI's critic step (Algorithm 1), when the heads' loss has one
    @property
    def has_critic(self) -> bool:
        return self.parameter_role == "critic"

    def is_critic_step(self, step: int) -> bool:
        return self._critics()[0].is_critic_step(step)

    def critic_loss(self, embeddings: Sequence[torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        critics = self._critics()
        total = critics[0].critic_loss(embeddings[0], labels)
        for loss, head in zip(critics[1:], embeddings[1:], strict=True):
            total = total + loss.critic_loss(head, labels)
        return total

    def update_beta(self) -> float:
        """Every head's beta; returns the high head's."""
        return [loss.update_beta() for loss in self._critics()][-1]

    @property
    def beta(self) -> float:
        return cast(_WithBeta, self.heads[-1]).beta

    def _critics(self) -> list[CriticLoss]:
        """The heads' losses as critic losses: the trainer asks for a critic step only of a
        loss whose heads parameter_role() checked as ones (builders.build_training_loss)."""
        return [cast(CriticLoss, loss) for loss in self.heads]
