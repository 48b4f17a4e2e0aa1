"""FAISS indexes of a gallery: choosing, building, reading, searching parameters, GPU copies.

Index types (the choice FAISS's own guidelines make by size):

- ``flat``: exact inner product, ``IndexIDMap2(IndexFlatIP)``;
- ``ivf``: ``IndexIVFFlat`` over an inner-product quantizer, ``nlist`` = the power of two
  nearest sqrt(N) (1024 lists at 1M, 4096 at 10M; at most N / 39 so that k-means has 39 points
  per centroid), k-means of 10 iterations on at most 64 points per list, ``nprobe`` = max(8,
  sqrt(nlist)) capped at ``nlist`` until tuned (index.ann.tuning);
- ``hnsw``: ``IndexIDMap2(IndexHNSWFlat(M=16, inner product))``, efConstruction 40, efSearch 64
  (tuned; raised to k for a search deeper than that);
- ``ivfpq`` / ``opq``: IVF-PQ, OPQ-rotated for ``opq``, codes of dim / 4 bytes; their searches
  re-rank the candidates by the exact vectors (index.ann.tuning). Their codes are trained on the
  gallery: they need at least PQ_MIN_ITEMS items, and ``opq`` one per dimension too
  (:func:`min_items`); fewer is refused in one line before any embedding;
- ``auto``: :func:`nearsight.index.ann.index_choice.resolve_index_type` (flat up to 1M items
  while it fits).

Distances. The embeddings are unit vectors, so FAISS ranks by inner product ``ip``; a search
reports the Euclidean distance between the unit vectors, ``sqrt(max(0, 2 - 2 ip))``: 0 for the
same direction, sqrt(2) for orthogonal, 2 for opposite. Smaller is nearer.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, cast

import faiss
import numpy as np

from nearsight.core.errors import NearsightError
from nearsight.index.catalog.store import GalleryError

INDEX_TYPES = ("auto", "flat", "ivf", "ivfpq", "opq", "hnsw")
IVF_TYPES = ("ivf", "ivfpq", "opq")  # searched with nprobe
PQ_TYPES = ("ivfpq", "opq")  # compressed: searches re-rank candidates with the exact vectors
METRIC = "inner_product"
# build speed first (autofaiss builds M=16 graphs too): half the links of M=32 build in about
# half the time; the recall lost is won back by the efSearch tuned at build time
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 40
HNSW_EF_SEARCH = 64
IVF_MIN_POINTS_PER_LIST = 39  # FAISS warns below this many training points per centroid
TRAIN_POINTS_PER_LIST = 64  # k-means sample per list (FAISS subsamples past 256)
IVF_KMEANS_ITERATIONS = 10  # FAISS's default is 25; the lists barely move after 10
OPQ_ITERATIONS = 10  # FAISS's OPQMatrix default is 50 rotation updates
ADD_BATCH = 1 << 18
# PQ sub-quantizer k-means: 10 iterations on 64 points per centroid (16k points) instead of
# FAISS's 25 on 256: the codes only pick candidates, which the exact re-rank orders
PQ_KMEANS_ITERATIONS = 10
PQ_POINTS_PER_CENTROID = 64
# the one floor of both PQ types: 2^8, the codebook of the 8-bit codes OPQ's rotation is always
# trained with in FAISS (fewer points than centroids is its error). IVF-PQ's codes have fewer
# bits below ~10k items (_make_pq_index) and could train on less: there is nothing to compress
PQ_MIN_ITEMS = 256


def unit_distance(inner_products: np.ndarray) -> np.ndarray:
    """Euclidean distance between unit vectors from their inner products."""
    # clipped: FAISS marks a missing neighbour with -FLT_MAX, whose doubling overflows
    ip = np.clip(np.asarray(inner_products, dtype=np.float32), -1.0, 1.0)
    return np.sqrt(2.0 - 2.0 * ip).astype(np.float32)


def min_items(index_type: str, dim: int | None) -> int:
    """The fewest items an index of ``index_type`` over ``dim``-dim vectors can be trained on.
    OPQ also needs one per dimension: FAISS's OPQMatrix::train writes a dim x dim product into
    a buffer of dim x items floats, corrupting memory (an abort, not an error) below that."""
    if index_type == "opq":
        if dim is None:  # index_choice.resolve_index_type's dim is optional: not for OPQ
            raise ValueError("the fewest items for index type 'opq' need the vectors' dim")
        return max(PQ_MIN_ITEMS, dim)
    return PQ_MIN_ITEMS if index_type in PQ_TYPES else 0  # the others train on any number


def check_trainable(index_type: str, count: int, dim: int | None) -> None:
    """One-line NearsightError when ``count`` items are too few to train ``index_type``."""
    needed = min_items(index_type, dim)
    if count < needed:
        why = "its codes"
        if needed > PQ_MIN_ITEMS:
            why += f" and its rotation of the {dim}-dim vectors"
        raise NearsightError(
            f"index type {index_type} needs at least {needed} items to train {why}, and there "
            f"are {count}: use flat (exact; small at this size), ivf or hnsw"
        )


def ivf_parameters(count: int) -> tuple[int, int]:
    """(nlist, nprobe) for an IVF index over ``count`` vectors."""
    nearest = 2 ** round(math.log2(max(1.0, math.sqrt(count))))
    nlist = max(1, min(nearest, count // IVF_MIN_POINTS_PER_LIST))
    nprobe = min(nlist, max(8, round(math.sqrt(nlist))))
    return nlist, nprobe


def make_index(
    vectors: np.ndarray, ids: np.ndarray, index_type: str, *, skip: np.ndarray | None = None
) -> tuple[faiss.Index, dict[str, Any]]:
    """A CPU FAISS index of type ``index_type`` (flat, ivf, hnsw) holding ``vectors`` under
    ``ids``, and its parameters for the gallery meta. ``skip``: positions trained on but not
    added yet (index.ann.tuning's held-out queries; ``add_vectors`` adds them after tuning)."""
    dim = vectors.shape[1]
    params: dict[str, Any] = {}
    index: faiss.Index
    if index_type == "flat":
        index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
    elif index_type == "ivf":
        nlist, nprobe = ivf_parameters(len(vectors))
        quantizer = faiss.IndexFlatIP(dim)
        ivf = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
        ivf.cp.min_points_per_centroid = 1  # tiny galleries: no "provide more points" warning
        ivf.cp.niter = IVF_KMEANS_ITERATIONS
        ivf.train(_training_sample(vectors, nlist))
        ivf.nprobe = nprobe
        index = ivf
        params = {"nlist": nlist, "nprobe": nprobe}
    elif index_type == "hnsw":
        hnsw = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        hnsw.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        hnsw.hnsw.efSearch = HNSW_EF_SEARCH
        index = faiss.IndexIDMap2(hnsw)
        params = {
            "hnsw_m": HNSW_M,
            "ef_construction": HNSW_EF_CONSTRUCTION,
            "ef_search": HNSW_EF_SEARCH,
        }
    elif index_type in PQ_TYPES:
        index, params = _make_pq_index(vectors, index_type)
    else:
        raise ValueError(f"unknown index type {index_type!r}")
    keep = None
    if skip is not None and len(skip):
        keep = np.ones(len(vectors), bool)
        keep[skip] = False
    add_vectors(index, vectors, ids, keep)
    return index, params


def add_vectors(
    index: faiss.Index, vectors: np.ndarray, ids: np.ndarray, keep: np.ndarray | None = None
) -> None:
    """Add ``vectors`` under ``ids`` (only the rows ``keep`` marks, when given) in batches, so
    the temporary memory of an add stays bounded and no masked copy of the whole is made."""
    for start in range(0, len(vectors), ADD_BATCH):
        end = start + ADD_BATCH
        batch, batch_ids = vectors[start:end], ids[start:end]
        if keep is not None:
            batch, batch_ids = batch[keep[start:end]], batch_ids[keep[start:end]]
        if len(batch):
            index.add_with_ids(np.ascontiguousarray(batch), np.ascontiguousarray(batch_ids))


def pq_bytes(dim: int) -> int:
    """PQ code size per vector: dim / 4 sub-quantizers of 8 bits (32 bytes at 128-d, 1/16 of
    the float32 vector; the largest of 64, 32, 16, 8, ... that divides dim). Sub-vectors of 4
    dims: 2-dim ones double the k-means work of training for codes the re-rank makes moot."""
    for size in (64, 32, 16, 8, 4, 2, 1):
        if size <= max(1, dim // 4) and dim % size == 0:
            return size
    return 1


def _make_pq_index(vectors: np.ndarray, index_type: str) -> tuple[faiss.Index, dict[str, Any]]:
    """IVF-PQ (or OPQ-rotated IVF-PQ) over inner product, trained on a sample."""
    count, dim = vectors.shape
    check_trainable(index_type, count, dim)  # below it FAISS fails, or corrupts memory (OPQ)
    nlist, nprobe = ivf_parameters(count)
    m = pq_bytes(dim)
    # PQ's own k-means has 2^nbits centroids per sub-quantizer: fewer for tiny galleries
    # (39 points per centroid, as for the lists: below that k-means splits empty clusters)
    nbits = min(8, max(1, int(math.log2(max(2, count // IVF_MIN_POINTS_PER_LIST)))))
    opq = "OPQ" + str(m) + "," if index_type == "opq" else ""
    index = faiss.index_factory(dim, f"{opq}IVF{nlist},PQ{m}x{nbits}", faiss.METRIC_INNER_PRODUCT)
    # the factory's "IVF...,PQ..." makes an IndexIVFPQ, behind an OPQ IndexPreTransform
    ivf = cast(faiss.IndexIVFPQ, faiss.downcast_index(faiss.extract_index_ivf(index)))
    ivf.cp.min_points_per_centroid = 1
    ivf.cp.niter = IVF_KMEANS_ITERATIONS
    if index_type == "opq":
        # chain is a SWIG vector (has .at); faiss's stubs call it a list
        first = cast(faiss.IndexPreTransform, index).chain.at(0)  # type: ignore[attr-defined]
        cast(faiss.OPQMatrix, faiss.downcast_VectorTransform(first)).niter = OPQ_ITERATIONS
    # the factory turns on polysemous training (annealing of the code order, for Hamming
    # filtering nearsight does not use): minutes of CPU for nothing
    ivf.do_polysemous_training = False  # type: ignore[attr-defined]  # absent from the stubs
    ivf.pq.cp.niter = PQ_KMEANS_ITERATIONS
    ivf.pq.cp.max_points_per_centroid = PQ_POINTS_PER_CENTROID
    index.train(_training_sample(vectors, nlist))
    ivf.nprobe = nprobe
    return index, {"nlist": nlist, "nprobe": nprobe, "pq_m": m, "pq_nbits": nbits}


def _training_sample(vectors: np.ndarray, nlist: int) -> np.ndarray:
    """At most TRAIN_POINTS_PER_LIST points per list (and enough for PQ's 256 centroids),
    drawn evenly: k-means time grows with the sample, its quality barely past this."""
    wanted = max(TRAIN_POINTS_PER_LIST * nlist, 256 * 64)
    if len(vectors) <= wanted:
        return np.ascontiguousarray(vectors)
    rows = np.random.default_rng(0).choice(len(vectors), wanted, replace=False)
    return np.ascontiguousarray(vectors[np.sort(rows)])


def read_index(path: Path, *, mmap: bool = False) -> faiss.Index:
    """Read a FAISS index; ``mmap``: map IVF lists from the file instead of reading them
    (read-only; FAISS reads the index whole where it cannot map it)."""
    try:
        if mmap and hasattr(faiss, "IO_FLAG_MMAP"):
            try:
                return faiss.read_index(str(path), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
            except RuntimeError:
                pass  # not mappable: read it whole below (a damaged file fails there too)
        return faiss.read_index(str(path))
    except RuntimeError as error:
        reason = " ".join(str(error).split()[-12:])
        raise GalleryError(f"{path} is not a readable FAISS index ({reason})") from None


def index_ids(index: faiss.Index) -> np.ndarray:
    """Every id an index holds (IDMap2 keeps them in a list; IVF in its inverted lists)."""
    if isinstance(index, faiss.IndexIDMap2 | faiss.IndexIDMap):
        return faiss.vector_to_array(index.id_map).astype(np.int64)
    ivf = faiss.extract_index_ivf(index)
    lists = ivf.invlists
    assert lists is not None, "an IVF index has inverted lists"
    chunks = [
        faiss.rev_swig_ptr(lists.get_ids(number), lists.list_size(number)).copy()
        for number in range(ivf.nlist)
        if lists.list_size(number)
    ]
    return np.concatenate(chunks).astype(np.int64) if chunks else np.zeros(0, np.int64)


def apply_search_parameters(index: faiss.Index, meta: dict) -> None:
    if meta.get("index_type") in IVF_TYPES and "nprobe" in meta:
        faiss.extract_index_ivf(index).nprobe = int(meta["nprobe"])
    if meta.get("index_type") == "hnsw" and "ef_search" in meta:
        # an HNSW gallery's index: IndexIDMap2 over IndexHNSWFlat (make_index)
        hnsw = faiss.downcast_index(cast(faiss.IndexIDMap2, index).index)
        cast(faiss.IndexHNSW, hnsw).hnsw.efSearch = int(meta["ef_search"])


def to_gpu(index: faiss.Index, index_type: str) -> faiss.Index | None:
    """A GPU copy of a flat or IVF index when FAISS sees a GPU (HNSW is CPU-only); None
    otherwise, or if the copy fails (search then stays on the CPU)."""
    if index_type not in ("flat", *IVF_TYPES) or index.ntotal == 0:
        return None
    try:
        if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() < 1:
            return None
        resources = faiss.StandardGpuResources()
        gpu = faiss.index_cpu_to_gpu(resources, 0, index)
        # keep the resources alive with the index (a SWIG attribute faiss's stubs lack)
        gpu.referenced_objects = [resources]  # type: ignore[attr-defined]
        return gpu
    except (RuntimeError, AttributeError):
        return None
