"""One batch's update in training: the forward pass (under bf16 autocast when the run uses
it), the embeddings gathered from every process, then either the embedding network's update
by the ranking loss, or, for RankMI's critic batches (Algorithm 1), the statistics network's
update on detached embeddings and a Newton re-estimate of beta.

:class:`~nearsight.training.trainer.Trainer` makes one per run and calls it through its
compiled step's guard (nearsight/training/compiled.py).
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn
from torch.autograd.profiler import record_function

from nearsight.models.embedding import EmbeddingNet
from nearsight.training.compiled import CompiledStep
from nearsight.training.distributed import DistInfo, average_replicated_grads, gather_with_grad
from nearsight.training.loss_roles import CriticLoss
from nearsight.training.step_io import step_input


def as_critic(loss: nn.Module) -> CriticLoss:
    """``loss`` as one with a critic: asked only when there is a critic optimiser, which
    build_critic_optimizer makes only for a loss parameter_role() checked as one."""
    return cast(CriticLoss, loss)


@dataclass
class BatchUpdate:
    """The parts one batch updates: ``model`` (its trunk frozen on request), run as
    ``step.model`` (DDP-wrapped and maybe compiled), ``loss_fn`` with ``optimizer``, and
    ``critic_optimizer`` (None: a loss without a critic)."""

    model: EmbeddingNet
    train_model: nn.Module
    step: CompiledStep
    loss_fn: nn.Module
    optimizer: torch.optim.Optimizer
    critic_optimizer: torch.optim.Optimizer | None
    dist: DistInfo
    device: torch.device
    channels_last: bool
    amp: bool
    multi_head: bool  # several heads: every head's embeddings, one loss instance each
    clip_grad_value: float | None

    def __call__(
        self, images: torch.Tensor, labels: torch.Tensor, critic: bool, freeze_trunk: bool
    ) -> torch.Tensor:
        """The batch's loss, on the device (read back later: no host sync here)."""
        step = self.step
        self.train_model.train()
        step.begin()
        images = step_input(images, self.device, self.channels_last)
        labels = labels.to(self.device, non_blocking=True)
        grad = torch.no_grad() if critic else contextlib.nullcontext()
        with grad, self._autocast(), record_function("nearsight.forward"):
            # several heads: every head's embeddings, one loss instance each (PerHeadLoss)
            local_embeddings = (
                step.model(images, all_heads=True) if self.multi_head else step.model(images)
            )
        embeddings: torch.Tensor | list[torch.Tensor]
        if self.multi_head:
            embeddings = [gather_with_grad(e.float(), self.dist) for e in local_embeddings]
        else:
            embeddings = gather_with_grad(local_embeddings.float(), self.dist)
        all_labels = gather_with_grad(labels, self.dist)
        if critic:
            return self._critic_update(embeddings, all_labels)
        return self._embedding_update(embeddings, all_labels, freeze_trunk)

    def _critic_update(
        self, embeddings: torch.Tensor | list[torch.Tensor], labels: torch.Tensor
    ) -> torch.Tensor:
        """All pairs of the batch, embeddings detached; then beta by Newton (lines 9-15)."""
        critic_optimizer, critic_fn = self.critic_optimizer, as_critic(self.loss_fn)
        assert critic_optimizer is not None, "a critic batch only with a critic optimiser"
        critic_optimizer.zero_grad(set_to_none=True)
        detached = (
            [e.detach() for e in embeddings]
            if isinstance(embeddings, list)
            else embeddings.detach()
        )
        with record_function("nearsight.critic"):
            critic_loss = critic_fn.critic_loss(detached, labels)
            critic_loss.backward()
            average_replicated_grads(self.loss_fn.parameters(), self.dist)
            critic_optimizer.step()
            critic_fn.update_beta()
        return critic_loss.detach()

    def _embedding_update(
        self, embeddings: torch.Tensor | list[torch.Tensor], labels: torch.Tensor, freeze: bool
    ) -> torch.Tensor:
        """The ranking loss's step of the embedding network (``freeze``: not of its trunk)."""
        with record_function("nearsight.loss"):
            loss = self.step.loss(embeddings, labels)
        self.optimizer.zero_grad(set_to_none=True)
        with record_function("nearsight.backward"):
            # DDP averages gradients over processes; each process's backward only reaches its
            # own slice of the global batch, so scaling by the world size gives the full-batch
            # gradient.
            (loss * self.dist.world).backward()
        with record_function("nearsight.optimizer"):
            # a loss's own parameters (proxies) are outside DDP: their gradient is already the
            # full-batch one, times the world size
            average_replicated_grads(self.loss_fn.parameters(), self.dist, scale=self.dist.world)
            if freeze:
                # the warm-up of new layers (optim.freeze_trunk_steps): no gradient, so neither
                # the step nor weight decay nor the optimiser's moments touch the trunk
                for parameter in self.model.trunk_parameters():
                    parameter.grad = None
            clip = self.clip_grad_value
            if clip is not None:  # after DDP's averaging: every process clips the same gradient
                parameters = [*self.model.parameters(), *self.loss_fn.parameters()]
                nn.utils.clip_grad_value_(parameters, clip)
            self.optimizer.step()
        return loss.detach()

    def _autocast(self) -> AbstractContextManager[object]:
        if self.amp:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()
