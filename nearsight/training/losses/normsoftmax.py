"""Normalised softmax (NormSoftmax) loss (baseline), through pytorch-metric-learning.

Paper: A. Zhai, H.-Y. Wu, "Classification is a Strong Baseline for Deep Metric Learning",
BMVC 2019, eq. 2: a softmax cross-entropy over the classes whose logits are cosine
similarities to one (L2-normalised) proxy per class divided by a temperature,

    l = -log( exp(x . w_y / sigma) / sum_c exp(x . w_c / sigma) ),  ||x|| = ||w_c|| = 1

Default ``temperature`` sigma 0.05, the paper's. Proxies are initialised as
pytorch-metric-learning does (standard normal, then normalised in the loss).
"""

from __future__ import annotations

from collections.abc import Sequence

from pytorch_metric_learning import losses

from nearsight.training.losses._proxy import ProxyLossBase


class NormSoftmaxLoss(ProxyLossBase):
    """``loss(embeddings [N, D] L2-normalised, labels [N]) -> scalar``; ``parameters()`` are the
    [D, C] proxies."""

    name = "normsoftmax"

    def __init__(
        self, class_labels: Sequence[int], embedding_size: int, temperature: float = 0.05
    ) -> None:
        super().__init__(class_labels, embedding_size)
        self.temperature = float(temperature)
        self.loss = losses.NormalizedSoftmaxLoss(
            self.num_classes, self.embedding_size, temperature=self.temperature
        )
