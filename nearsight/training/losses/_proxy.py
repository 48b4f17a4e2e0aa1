"""What the proxy losses share: one trainable proxy per training class, labels mapped to rows.

A proxy loss (Proxy Anchor, NormSoftmax, ArcFace) keeps a [C, D] matrix of class proxies as
its own ``parameters()``: they train with the embedding network, in their own optimiser group
(``optim.loss_lr``, see nearsight/training/loss_roles.py), are saved in ``last.pt`` with the loss's
``state_dict()`` and restored on resume. pytorch-metric-learning indexes proxies by the label
itself, so the training set's labels (any integers, e.g. CUB's 0..99) are mapped to rows
0..C-1 here, in the order of the sorted ``class_labels``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from nearsight.training.losses._pairs import check_on_host
from nearsight.training.losses.registry import LossConfigError


class ProxyLossBase(nn.Module):
    """``loss(embeddings [N, D], labels [N]) -> scalar`` through ``self.loss``, a
    pytorch-metric-learning proxy loss over ``len(class_labels)`` classes that the subclass
    builds in ``__init__`` (after calling this one)."""

    name = "proxy"
    # why the trainer does not compile it into the step (nearsight/training/compiled.py)
    compile_note = (
        "pytorch-metric-learning's loss finds the proxies with positives by torch.where (a "
        "data-dependent shape) and branches on tensor values in its reducer"
    )
    # the proxies train with the embedding network, in their own optimiser group
    # (nearsight/training/loss_roles.py)
    parameter_role = "joint"

    class_labels: torch.Tensor  # a buffer: the proxies' class labels, sorted
    loss: nn.Module  # the pytorch-metric-learning loss, built by the subclass's __init__

    def __init__(self, class_labels: Sequence[int], embedding_size: int) -> None:
        super().__init__()
        labels = sorted({int(label) for label in class_labels})
        if len(labels) < 2:
            raise LossConfigError(f"{self.name}: needs at least 2 training classes, got {labels}")
        if isinstance(embedding_size, bool) or int(embedding_size) < 1:
            raise LossConfigError(f"{self.name}: embedding_size must be >= 1, got {embedding_size}")
        self.num_classes = len(labels)
        self.embedding_size = int(embedding_size)
        # rebuilt from the data on every start (not part of the state_dict)
        self.register_buffer("class_labels", torch.tensor(labels), persistent=False)

    def parameter_groups(self) -> list[dict]:
        """One optimiser group, the proxies (its learning rate: ``optim.loss_lr``)."""
        return [{"name": f"{self.name}_proxies", "params": list(self.parameters())}]

    def class_index(self, labels: torch.Tensor) -> torch.Tensor:
        """Rows of the proxy matrix for ``labels``; a label the loss was not built with is an
        error (its proxy does not exist)."""
        known = self.class_labels.to(labels.device)
        index = torch.searchsorted(known, labels).clamp(max=self.num_classes - 1)
        if not check_on_host(labels):
            # no host sync inside a compiled or CUDA step: the device checks
            torch._assert_async(
                (known[index] == labels).all(), f"{self.name}: a label has no proxy"
            )
        elif not torch.equal(known[index], labels):
            unknown = sorted(set(labels.tolist()) - set(known.tolist()))
            raise LossConfigError(f"{self.name}: labels {unknown[:5]} have no proxy")
        return index

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.loss(embeddings, self.class_index(labels.reshape(-1)))
