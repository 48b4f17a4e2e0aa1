"""Batch samplers: the (m,n)-group design, the p-random pair design and m-per-class batches.

Each sampler is a ``torch.utils.data.Sampler[list[int]]`` for a DataLoader's
``batch_sampler``, built by name:

>>> sampler = build_sampler("group", labels, m=4, n=16, seed=0)
>>> loader = DataLoader(dataset, batch_sampler=sampler)
>>> loss = build_loss("bcontrastive", class_counts=sampler.class_counts(),
...                   **sampler.design_params())

Common interface: ``__init__(labels, ..., seed=0)``; ``len()`` batches per epoch;
``set_epoch(epoch, start_batch=0)`` before each epoch (``start_batch`` = batches of that epoch
already consumed, for an exact resume); ``batch_size``; ``class_counts()`` (label -> images, of
the classes the sampler draws); ``design_params()`` (bcontrastive's design keywords). Batches
depend only on (seed, epoch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nearsight.training.registry_checks import check_parameters, init_parameters
from nearsight.training.samplers._base import SamplerConfigError, SeededBatchSampler
from nearsight.training.samplers.group import GroupBatchSampler
from nearsight.training.samplers.m_per_class import MPerClassSampler
from nearsight.training.samplers.random_pairs import RandomPairBatchSampler

SAMPLERS: dict[str, type[SeededBatchSampler]] = {
    "group": GroupBatchSampler,
    "random": RandomPairBatchSampler,
    "m_per_class": MPerClassSampler,
}


def sampler_parameters(name: str) -> dict[str, Any]:
    """The parameters of sampler ``name`` after ``labels``, with their defaults
    (``inspect.Parameter.empty`` for required ones)."""
    if name not in SAMPLERS:
        raise SamplerConfigError(
            f"unknown sampler {name!r}; valid samplers: {', '.join(sorted(SAMPLERS))}"
        )
    return init_parameters(SAMPLERS[name], skip=("labels",))


def build_sampler(name: str, labels: Sequence[int], **params: Any) -> SeededBatchSampler:
    """Build sampler ``name`` over ``labels`` (one per dataset item) with keyword ``params``;
    unknown names, unknown or missing parameters raise :class:`SamplerConfigError`."""
    check_parameters("sampler", name, sampler_parameters(name), params, SamplerConfigError)
    return SAMPLERS[name](labels, **params)


__all__ = [
    "SAMPLERS",
    "GroupBatchSampler",
    "MPerClassSampler",
    "RandomPairBatchSampler",
    "SamplerConfigError",
    "build_sampler",
    "sampler_parameters",
]
