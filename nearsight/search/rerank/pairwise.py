"""The learned pairwise re-ranker (``pairwise:model=FILE``), run by onnxruntime: no torch.

The file is written by ``nearsight rerank train`` (nearsight.training.pairwise). Its graph takes
``query`` [B, D] and ``candidates`` [B, N, D] (unit vectors, the base search's top N in its
order) and gives ``scores`` [B, N], higher for a likelier same-class pair; the pair features
(products, differences, ranks, and each candidate's agreement with the other candidates) are
computed inside the graph, so the numbers served are the numbers trained. Its metadata names
the embedding model it was trained for (``embedding_model_sha256``, the hash galleries record):
any other gallery is refused in one line.
"""

from __future__ import annotations

import os
import stat
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from nearsight.core.errors import NearsightError

ARTIFACT = "nearsight-pairwise-reranker"  # metadata "artifact" of a re-ranker file
FORMAT = "1"  # metadata "format": the graph's inputs and outputs as described above
INPUTS = ("query", "candidates")
OUTPUT = "scores"
MAX_FILE_BYTES = 64 * 1024 * 1024  # a small MLP is well under 1 MB; refuse anything huge
# work budget of one onnxruntime call: query-candidate pairs (a [B, N, N] context matrix is
# part of the graph, so B = MAX_RUN_PAIRS // N queries at a time keep its memory in tens of MB)
MAX_RUN_PAIRS = 8192
_CACHE_SIZE = 4  # re-rankers kept open per process (keyed by path, inode, size, mtime)
_cache: OrderedDict[tuple[str, int, int, int, int], PairwiseReranker] = OrderedDict()
_lock = threading.Lock()


class PairwiseReranker:
    """An open re-ranker file: its onnxruntime session and what its metadata says."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        import onnxruntime as ort

        from nearsight.core.threads import worker_threads

        self.path = Path(path)
        options = ort.SessionOptions()
        options.intra_op_num_threads = worker_threads()
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        try:
            self._session = ort.InferenceSession(
                str(self.path), options, providers=["CPUExecutionProvider"]
            )
        except Exception as error:  # onnxruntime raises its own types for a bad file
            raise NearsightError(
                f"{self.path} is not an ONNX re-ranker onnxruntime can read "
                f"({' '.join(str(error).split())[:200]})"
            ) from None
        meta = dict(self._session.get_modelmeta().custom_metadata_map)
        names = tuple(i.name for i in self._session.get_inputs())
        outputs = tuple(o.name for o in self._session.get_outputs())
        if meta.get("artifact") != ARTIFACT or names != INPUTS or outputs != (OUTPUT,):
            raise NearsightError(
                f"{self.path} is not a nearsight pairwise re-ranker (make one with nearsight "
                "rerank train)"
            )
        if meta.get("format") != FORMAT:
            raise NearsightError(
                f"{self.path} is a re-ranker of format {meta.get('format')!r}; this nearsight "
                f"reads format {FORMAT}: train it again with nearsight rerank train"
            )
        self.meta = meta
        self.model_sha256 = meta.get("embedding_model_sha256", "")
        self.dim = int(meta.get("dim", "0"))

    def check_for(self, model_sha256: str | None, dim: int) -> None:
        """NearsightError unless this re-ranker was trained for the embedding model (by its
        sha256) and width of the vectors it is asked to re-rank."""
        if model_sha256 is not None and model_sha256 != self.model_sha256:
            raise NearsightError(
                f"re-ranker {self.path} was trained for model {self.model_sha256[:12]}, not "
                f"this gallery's model {str(model_sha256)[:12]}: train one for it with "
                "nearsight rerank train --model MODEL.onnx"
            )
        if dim != self.dim:
            raise NearsightError(
                f"re-ranker {self.path} takes {self.dim}-d vectors, the gallery has {dim}"
            )

    def scores(self, queries: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        """float32 [Q, N] scores of each query's candidates [Q, N, D] (higher: likelier the
        same class), at most :data:`MAX_RUN_PAIRS` pairs per onnxruntime call."""
        q, n = candidates.shape[:2]
        out = np.empty((q, n), dtype=np.float32)
        step = max(1, MAX_RUN_PAIRS // max(n, 1))
        for start in range(0, q, step):
            block = slice(start, start + step)
            (out[block],) = self._session.run(
                [OUTPUT],
                {
                    "query": np.ascontiguousarray(queries[block], dtype=np.float32),
                    "candidates": np.ascontiguousarray(candidates[block], dtype=np.float32),
                },
            )
        return out


def load_reranker(path: str | os.PathLike[str]) -> PairwiseReranker:
    """The re-ranker in ``path``, opened once per process while the file is unchanged (a
    one-line NearsightError when it is missing, too large or not a re-ranker)."""
    text = os.fspath(path)
    try:  # one stat per search: the cache key is the file as it is now, not its old name
        info = os.stat(text)
    except OSError as error:
        raise NearsightError(f"re-ranker {text}: {error.strerror or error}") from None
    if not stat.S_ISREG(info.st_mode):
        raise NearsightError(f"re-ranker {text} is not a file")
    if info.st_size > MAX_FILE_BYTES:
        raise NearsightError(
            f"re-ranker {text} is {info.st_size / 2**20:.0f} MB; a nearsight re-ranker is "
            f"under {MAX_FILE_BYTES // 2**20} MB"
        )
    key = (text, info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    opened = PairwiseReranker(text)
    with _lock:
        _cache[key] = opened
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return opened


def pairwise_distances(
    params: dict[str, Any],
    queries: np.ndarray,
    vectors: np.ndarray,
    valid: np.ndarray,
    model_sha256: str | None,
) -> np.ndarray:
    """[Q, N] distances for :func:`nearsight.search.rerank.pipeline.rerank`: minus the scores
    of the first ``depth`` candidates, inf for the rest (they keep the base order after them)
    and for missing ones. ``model_sha256``: the embedding model of the vectors (None: vectors
    of no recorded model, as in a bench's matrix; not checked)."""
    reranker = load_reranker(str(params["model"]))
    reranker.check_for(model_sha256, queries.shape[1])
    depth = min(int(params["depth"]), vectors.shape[1])
    head = vectors[:, :depth]  # a missing candidate's vector is zeros already (the pipeline)
    distances = np.full(valid.shape, np.inf)
    distances[:, :depth] = -reranker.scores(queries, head).astype(np.float64)
    return np.where(valid, distances, np.inf)
