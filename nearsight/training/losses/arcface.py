"""ArcFace, additive angular margin loss (baseline), through pytorch-metric-learning.

Paper: J. Deng, J. Guo, N. Xue, S. Zafeiriou, "ArcFace: Additive Angular Margin Loss for Deep
Face Recognition", CVPR 2019, eq. 3: softmax cross-entropy whose target logit is
s cos(theta_y + m) and whose other logits are s cos(theta_c), theta the angle between the
embedding and a class proxy.

Defaults are the paper's: ``scale`` s 64 and ``margin`` m 0.5 rad, given here in degrees
(28.6), as pytorch-metric-learning takes it.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytorch_metric_learning import losses

from nearsight.training.losses._proxy import ProxyLossBase


class ArcFaceLoss(ProxyLossBase):
    """``loss(embeddings [N, D] L2-normalised, labels [N]) -> scalar``; ``parameters()`` are the
    [D, C] proxies."""

    name = "arcface"

    def __init__(
        self,
        class_labels: Sequence[int],
        embedding_size: int,
        margin: float = 28.6,
        scale: float = 64.0,
    ) -> None:
        super().__init__(class_labels, embedding_size)
        self.margin = float(margin)
        self.scale = float(scale)
        self.loss = losses.ArcFaceLoss(
            self.num_classes, self.embedding_size, margin=self.margin, scale=self.scale
        )
