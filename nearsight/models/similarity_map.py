"""Where in two images their similarity comes from: the pooled similarity of a CNN with global
average pooling, decomposed over the locations of its last feature map (Stylianou, Xuan, Shah
and Pless, "Visualizing Deep Similarity Networks", WACV 2019).

With average pooling the embedding before its L2 norm is the mean over locations of the head
applied to each location's features (the head, BatchNorm at inference and a linear layer, is
affine, so it commutes with the mean): z = (1/L) sum_l u_l. The cosine similarity of two images
is then exactly sum_l (u_l . e_B) / (L |z_A|) over the locations of A, and the same over B's:
each map sums back to the similarity. Only torchvision ResNet trunks serving their layer4 head
with ``avg`` pooling have such a map; any other model says so in one line. torch is imported
when a map is made.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass

import numpy as np

from nearsight.core.errors import NearsightError
from nearsight.models.spec import ModelSpec, is_timm


@dataclass
class SimilarityMaps:
    """The similarity of two images and its share at each location of each feature map."""

    similarity: float  # the cosine of the two embeddings, as the network computes them
    map_a: np.ndarray  # float64 [h, w]: sums to the similarity
    map_b: np.ndarray


def no_map_reason(spec: ModelSpec) -> str | None:
    """Why a model has no similarity map (None: it has one)."""
    if spec.foreign:
        return "an ONNX model exported elsewhere has no feature map nearsight can read"
    if is_timm(spec.arch):
        return f"{spec.arch} is a timm trunk: only torchvision ResNets have a similarity map here"
    if spec.pooling != "avg":
        return (
            f"the model pools with {spec.pooling!r}: only average pooling decomposes the "
            "similarity over the feature map's locations"
        )
    if spec.embedding == "concat" and len(spec.heads) > 1:
        return "the model serves several heads concatenated: only one head's map is drawn"
    return None


class SimilarityMapper:
    """A checkpoint's network, ready to draw similarity maps (``NearsightError`` when the model
    has no such map)."""

    def __init__(self, checkpoint: str | os.PathLike[str]) -> None:
        from nearsight.models.torch_embedder import TorchEmbedder

        self.embedder = TorchEmbedder(checkpoint, device="cpu", amp=False, channels_last=False)
        reason = no_map_reason(self.embedder.spec)
        if reason is not None:
            raise NearsightError(f"no similarity map: {reason}")

    def maps(self, pixels_a: np.ndarray, pixels_b: np.ndarray) -> SimilarityMaps:
        """The maps of two images as the model's input ([3, S, S] in [0, 1], test-transformed
        as the gallery's images were)."""
        import torch

        net = self.embedder.net
        batch = torch.as_tensor(np.stack([pixels_a, pixels_b]), dtype=torch.float32)
        with torch.inference_mode():
            x = (batch - net.mean) / net.std
            for layer in net.trunk.children():
                x = layer(x)
            features = x.double()  # [2, C, h, w]
            count, channels, height, width = features.shape
            per_location = features.permute(0, 2, 3, 1).reshape(-1, channels)
            head = copy.deepcopy(net.embedding).double()
            norm = copy.deepcopy(net.feature_norm).double()
            local = head(norm(per_location)).reshape(count, height * width, -1)  # u_l
            pooled = local.mean(dim=1)  # z
            lengths = pooled.norm(dim=1, keepdim=True)
            unit = pooled / lengths  # e
            map_a = local[0] @ unit[1] / (height * width * lengths[0])
            map_b = local[1] @ unit[0] / (height * width * lengths[1])
            served = net(batch).double()  # the embedding as the network serves it (float32)
        return SimilarityMaps(
            similarity=float(served[0] @ served[1]),
            map_a=map_a.reshape(height, width).numpy(),
            map_b=map_b.reshape(height, width).numpy(),
        )
