"""Global pooling of a feature map or of a transformer's tokens into one vector per image.

- ``avg``: the mean (the papers' ResNet-50 pool); ``max``: the maximum; ``avgmax``: their SUM,
  as in common DML code (Proxy-Anchor's and Roth et al.'s ResNet-50 wrappers), which keeps the
  width; ``gem``: generalised mean, (mean x^p)^(1/p) with p = 3 (Radenovic et al., "Fine-tuning
  CNN Image Retrieval with No Human Annotation", TPAMI 2018, whose learnt p settles near 3),
  over a feature map on the features clamped at 1e-6 (the root needs non-negative values;
  post-ReLU maps are); over a transformer's tokens, which are signed (nothing clips them after
  the final LayerNorm), the signed mean sign(m) |m|^(1/p) of m = mean(sign(x) |x|^p), which is
  GeM wherever the values are non-negative and keeps a negative feature negative where the
  clamp would flatten it to 1e-6;
- ``token`` (transformers only): the class token.

Over a transformer's tokens the pools other than ``token`` run over the patch tokens only (the
class and register tokens are left out).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

GEM_P = 3.0
GEM_EPS = 1e-6


def pool_map(features: torch.Tensor, pooling: str) -> torch.Tensor:
    """[N, C, H, W] -> [N, C, 1, 1]."""
    if pooling == "avg":
        return F.adaptive_avg_pool2d(features, 1)
    if pooling == "max":
        return F.adaptive_max_pool2d(features, 1)
    if pooling == "avgmax":
        return F.adaptive_avg_pool2d(features, 1) + F.adaptive_max_pool2d(features, 1)
    if pooling == "gem":
        powered = features.clamp(min=GEM_EPS).pow(GEM_P)
        return F.adaptive_avg_pool2d(powered, 1).pow(1.0 / GEM_P)
    raise ValueError(f"pooling {pooling!r} does not apply to a feature map")


def pool_tokens(tokens: torch.Tensor, pooling: str, prefix_tokens: int) -> torch.Tensor:
    """[N, L, C] -> [N, C]; the first ``prefix_tokens`` are the class (and register) tokens."""
    if pooling == "token":
        return tokens[:, 0]
    patches = tokens[:, prefix_tokens:]
    if pooling == "avg":
        return patches.mean(dim=1)
    if pooling == "max":
        return patches.amax(dim=1)
    if pooling == "avgmax":
        return patches.mean(dim=1) + patches.amax(dim=1)
    if pooling == "gem":
        return signed_gem(patches, dim=1)
    raise ValueError(f"unknown pooling {pooling!r}")


def signed_gem(values: torch.Tensor, dim: int, p: float = GEM_P) -> torch.Tensor:
    """The generalised mean of signed values along ``dim`` (module docstring). A mean within
    GEM_EPS of 0 is taken as GEM_EPS (with its sign; exactly 0 stays 0): the root's slope
    grows without bound at 0, and autograd would give NaN there."""
    mean = (values.sign() * values.abs().pow(p)).mean(dim=dim)
    return mean.sign() * mean.abs().clamp(min=GEM_EPS).pow(1.0 / p)
