"""What the trainer does with a loss's own trainable parameters, as the loss declares it.

Most losses are functions of the embeddings and own no trainable parameter. A loss that does
says how they train through the class attribute (or instance attribute) ``parameter_role``:

- ``"none"`` (also when the loss declares nothing): no trainable parameters. A loss that has
  some but declares no role is refused, so no parameter silently stays at its initial value.
- ``"joint"``: trained with the embedding network by the same optimiser and schedule, e.g.
  class proxies (Proxy-NCA, Proxy-Anchor, NormSoftmax) or the margin loss's learnt beta. The
  loss provides ``parameter_groups()``: optimiser groups, each a dict with ``params`` and
  ``name`` and, optionally, its own ``lr`` (default ``optim.loss_lr``, else ``optim.head_lr``).
- ``"critic"``: trained by its own optimiser on batches of their own, alternating with the
  embedding's (RankMI's statistics network, Algorithm 1 of Kemertas et al. 2020). The loss
  provides ``is_critic_step(batch)``, ``critic_loss(embeddings, labels)`` and ``update_beta()``.

A loss may also provide ``logged_scalars()`` -> {name: value}: its own numbers for the logs
(RankMI's beta, the margin loss's beta), each under the name the loss gives it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import nn

from nearsight.core.errors import NearsightError

ROLES = ("none", "joint", "critic")


@runtime_checkable
class JointParameterLoss(Protocol):
    parameter_role: ClassVar[str]  # "joint"

    def parameter_groups(self) -> list[dict[str, Any]]: ...


@runtime_checkable
class CriticLoss(Protocol):
    parameter_role: ClassVar[str]  # "critic"

    def is_critic_step(self, batch: int) -> bool: ...

    # embeddings as the loss's forward takes them: one tensor, or one per head (PerHeadLoss)
    def critic_loss(
        self, embeddings: torch.Tensor | Sequence[torch.Tensor], labels: torch.Tensor
    ) -> torch.Tensor: ...

    def update_beta(self) -> float: ...


def parameter_role(loss: nn.Module) -> str:
    """The role the loss declares; refuses an undeclared loss with trainable parameters."""
    role = getattr(loss, "parameter_role", "none")
    name = type(loss).__name__
    if role not in ROLES:
        raise NearsightError(f"loss {name} declares parameter_role {role!r}; valid: {ROLES}")
    trainable = any(p.requires_grad for p in loss.parameters())
    if role == "none" and trainable:
        raise NearsightError(
            f"loss {name} has trainable parameters but declares no parameter_role "
            "(joint or critic): they would never be trained"
        )
    required = {"joint": JointParameterLoss, "critic": CriticLoss}.get(role)
    if required is not None and not isinstance(loss, required):
        raise NearsightError(f"loss {name} declares role {role!r} but lacks its methods")
    return role


def logged_scalars(loss: nn.Module) -> dict[str, float]:
    """The loss's own numbers for the logs (empty when it has none)."""
    scalars = getattr(loss, "logged_scalars", None)
    return dict(scalars()) if callable(scalars) else {}
