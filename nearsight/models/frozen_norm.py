"""BatchNorm with frozen statistics (``freeze_bn``), trained as the per-channel affine map it is.

A frozen BatchNorm2d normalises with its running statistics, so while it trains it computes
``x * scale + shift`` with ``scale = weight / sqrt(running_var + eps)`` and
``shift = bias - running_mean * scale``, and only ``weight`` and ``bias`` learn. PyTorch runs an
eval-mode batch norm that needs a gradient through its generic kernels: float32 copies of
bf16 activations on the way in and out and a backward written for batch statistics. As one
``addcmul`` in the activations' own dtype, the same map costs one elementwise pass forward and
one backward, and fuses with the next ReLU under ``torch.compile``.

Everywhere else (evaluation, export, inference without gradients) the module is the plain
BatchNorm2d it subclasses: the state dict, the ONNX graph (one BatchNormalization node) and
every result are unchanged.
"""

from __future__ import annotations

import torch
from torch import nn


class FrozenStatsBatchNorm2d(nn.BatchNorm2d):
    """A BatchNorm2d whose statistics stay frozen while its network trains.

    ``affine_while_training`` is set by the network's ``train(mode)``: only then, and only
    when autograd records, does ``forward`` take the affine path.
    """

    affine_while_training: bool = False

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not (self.affine_while_training and torch.is_grad_enabled()) or self.training:
            return super().forward(input)
        assert self.running_var is not None and self.running_mean is not None
        scale = torch.rsqrt(self.running_var + self.eps)
        if self.weight is not None:
            scale = self.weight * scale
        shift = -self.running_mean * scale
        if self.bias is not None:
            shift = shift + self.bias
        shape = (1, -1, 1, 1)
        return torch.addcmul(
            shift.to(input.dtype).view(shape), input, scale.to(input.dtype).view(shape)
        )


def freeze_batch_norms(trunk: nn.Module, training: bool) -> None:
    """Put every BatchNorm2d of ``trunk`` in eval mode (frozen statistics); while the network
    trains, each computes its affine map (:class:`FrozenStatsBatchNorm2d`)."""
    for module in trunk.modules():
        if not isinstance(module, nn.BatchNorm2d):
            continue
        if type(module) is nn.BatchNorm2d:
            # the same parameters and buffers under the subclass: no copy, same state dict
            module.__class__ = FrozenStatsBatchNorm2d
        module.eval()
        if isinstance(module, FrozenStatsBatchNorm2d):
            module.affine_while_training = training
