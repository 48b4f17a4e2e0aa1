"""Which index ``auto`` builds: autofaiss's rules (criteo/autofaiss,
``external/optimize.py:get_optimal_index_keys_v2``), followed rather than imported.

autofaiss is not a dependency: it pins its own faiss-cpu, which would replace the faiss (GPU
build on Linux x86-64) that nearsight installs, and it pulls in fsspec, pyarrow and
embedding-reader for a dozen lines of rules. The rules, for N vectors of dim D and a memory
budget B bytes:

1. N < 1,000: flat (autofaiss) -- nearsight keeps exact search further, up to 1M items while
   the flat index fits in B: evaluation and the demo's numbers stay exact (search times by
   size: docs/scale.md);
2. HNSW when a graph of M >= 8 links fits: M = floor((B / (4 N) - D) / 2) (autofaiss; nearsight
   builds M = nearsight.index.ann.faiss_index.HNSW_M, so it asks for 4 (D + 2 M) + 8 bytes per item);
3. below 1M items (or with a GPU) an IVF-Flat that fits B (autofaiss's ivf_flat_threshold);
4. otherwise product quantization: autofaiss's "OPQ{m}_{y},IVF{n},PQ{m}x8" with the largest
   code that fits B; here ``opq`` with dim / 4 bytes per vector (nearsight.index.ann.faiss_index.pq_bytes),
   plus an 8-byte id, searched with an exact re-rank of the candidates from embeddings.npy
   (``ivfpq`` for fewer items than dimensions, too few to train OPQ's rotation).

nlist is the power of two nearest sqrt(N) (nearsight.index.ann.faiss_index.ivf_parameters; autofaiss takes
4 sqrt(N) below 1M items and 16k-256k lists past that: too slow to train and fill on a small
machine, docs/decisions.md "Index choice"), trained, like autofaiss, on a capped sample (64 points per list). autofaiss tunes nprobe/efSearch for a
latency target; nearsight tunes them for a recall target (nearsight.index.ann.tuning).
"""

from __future__ import annotations

import math
import os
import re

from nearsight.core.errors import NearsightError
from nearsight.index.ann.faiss_index import (
    HNSW_M,
    INDEX_TYPES,
    check_trainable,
    min_items,
    pq_bytes,
)

FLAT_MAX_ITEMS = 1_000_000  # exact search up to here while it fits the budget
AUTOFAISS_FLAT_ITEMS = 1_000
IVF_FLAT_MAX_ITEMS = 1_000_000  # autofaiss's ivf_flat_threshold
ID_BYTES = 8
DEFAULT_MEMORY_SHARE = 0.25  # of this machine's RAM, the default --max-index-memory
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_memory(text: str | int | None) -> int:
    """Bytes from "4G", "512M", "1.5T", "1000000" (binary units); None: the default share of
    RAM."""
    if text is None:
        return default_index_memory()
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)i?B?\s*", str(text).upper())
    if not match or float(match.group(1)) <= 0:
        raise NearsightError(f"--max-index-memory must look like 4G or 512M, got {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def default_index_memory() -> int:
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        ram = 8 << 30
    return int(ram * DEFAULT_MEMORY_SHARE)


def index_bytes(index_type: str, count: int, dim: int) -> int:
    """Estimated memory of an index of ``count`` vectors (codes, links and ids; centroids and
    other fixed costs left out)."""

    per_item = {
        "flat": 4 * dim + ID_BYTES,
        "ivf": 4 * dim + ID_BYTES,
        "hnsw": 4 * (dim + 2 * HNSW_M) + ID_BYTES,
        "ivfpq": pq_bytes(dim) + ID_BYTES,
        "opq": pq_bytes(dim) + ID_BYTES,
    }[index_type]
    return per_item * count


def choose_index_type(count: int, dim: int, max_memory: int | None = None) -> str:

    budget = parse_memory(max_memory)
    if count < AUTOFAISS_FLAT_ITEMS:
        return "flat"
    if count <= FLAT_MAX_ITEMS and index_bytes("flat", count, dim) <= budget:
        return "flat"
    links = math.floor((budget / (4 * count) - dim) / 2)
    if links >= 8 and index_bytes("hnsw", count, dim) <= budget:
        return "hnsw"
    if count < IVF_FLAT_MAX_ITEMS and index_bytes("ivf", count, dim) <= budget:
        return "ivf"
    # OPQ's rotation needs an item per dimension (faiss_index.min_items); IVF-PQ does not
    return "opq" if count >= min_items("opq", dim) else "ivfpq"


def resolve_index_type(
    index_type: str, count: int, dim: int | None = None, max_memory: int | None = None
) -> str:
    """The concrete index type: ``index_type`` itself, or for ``auto`` the choice of
    this module by item count and memory budget (bytes; default a share of RAM)."""
    if index_type not in INDEX_TYPES:
        raise NearsightError(
            f"unknown index type '{index_type}' (choose one of: {', '.join(INDEX_TYPES)})"
        )
    if index_type == "auto":
        if dim is None:
            raise ValueError("resolving index type 'auto' needs the vectors' dim")
        return choose_index_type(count, dim, max_memory)
    check_trainable(index_type, count, dim)
    return index_type
