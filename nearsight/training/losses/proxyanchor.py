"""Proxy Anchor loss (baseline), through pytorch-metric-learning.

Paper: S. Kim, D. Kim, M. Cho, S. Kwak, "Proxy Anchor Loss for Deep Metric Learning",
CVPR 2020, eq. 4: with one proxy p per class, P the proxies of all classes, P+ those with a
positive in the batch, X_p+ (X_p-) the batch's embeddings of (not of) p's class and s the
cosine similarity,

    l = 1/|P+| sum_{p in P+} log(1 + sum_{x in X_p+} exp(-alpha (s(x, p) - delta)))
      + 1/|P|  sum_{p in P}  log(1 + sum_{x in X_p-} exp( alpha (s(x, p) + delta)))

Defaults are the paper's: ``alpha`` 32, ``margin`` delta 0.1; proxies initialised
Kaiming-normal (fan_out), as the authors' code and pytorch-metric-learning do. The paper trains
the proxies at 100 times the network's learning rate (the configs set ``loss.lr``).
"""

from __future__ import annotations

from collections.abc import Sequence

from pytorch_metric_learning import losses

from nearsight.training.losses._proxy import ProxyLossBase


class ProxyAnchorLoss(ProxyLossBase):
    """``loss(embeddings [N, D] L2-normalised, labels [N]) -> scalar``; ``parameters()`` are the
    [C, D] proxies."""

    name = "proxyanchor"

    def __init__(
        self,
        class_labels: Sequence[int],
        embedding_size: int,
        margin: float = 0.1,
        alpha: float = 32.0,
    ) -> None:
        super().__init__(class_labels, embedding_size)
        self.margin = float(margin)
        self.alpha = float(alpha)
        self.loss = losses.ProxyAnchorLoss(
            self.num_classes, self.embedding_size, margin=self.margin, alpha=self.alpha
        )
