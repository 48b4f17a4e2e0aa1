"""The learned pairwise re-ranker (``pairwise:model=FILE``), run by onnxruntime: no torch.

The file is written by ``nearsight rerank train`` (nearsight.training.pairwise). Its graph takes
``query`` [B, D] and ``candidates`` [B, N, D] (unit vectors, the base search's top N in its
order) and gives ``scores`` [B, N], higher for a likelier same-class pair; the pair features
(products, differences, ranks, and each candidate's agreement with the other candidates) are
computed inside the graph, so the numbers served are the numbers trained. Its metadata names
the embedding model it was trained for (``embedding_model_sha256``, the hash galleries record):
any other gallery is refused in one line.

A format-2 file also scores by a trunk stage's pooled features (``query_side`` [B, F],
``candidate_side`` [B, N, F]; metadata ``side_stage``, ``side_dim``;
nearsight.search.rerank.stage_features computes them): the source of the candidates must hold
those features (``side_of``), or the search is refused in one line.
"""

from __future__ import annotations

import os
import stat
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from nearsight.core.errors import NearsightError

if TYPE_CHECKING:
    from nearsight.search.rerank.stage_store import StageStore

ARTIFACT = "nearsight-pairwise-reranker"  # metadata "artifact" of a re-ranker file
FORMAT = "1"  # metadata "format": the graph's inputs and outputs as described above
FORMAT_SIDE = "2"  # format 1 and the stage features' inputs
INPUTS = ("query", "candidates")
SIDE_INPUTS = ("query_side", "candidate_side")
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
        if meta.get("artifact") != ARTIFACT or names[:2] != INPUTS or outputs != (OUTPUT,):
            raise NearsightError(
                f"{self.path} is not a nearsight pairwise re-ranker (make one with nearsight "
                "rerank train)"
            )
        expected = {FORMAT: INPUTS, FORMAT_SIDE: INPUTS + SIDE_INPUTS}.get(meta.get("format", ""))
        if expected != names:
            raise NearsightError(
                f"{self.path} is a re-ranker of format {meta.get('format')!r}; this nearsight "
                f"reads formats {FORMAT} and {FORMAT_SIDE}: train it again with nearsight "
                "rerank train"
            )
        self.meta = meta
        self.model_sha256 = meta.get("embedding_model_sha256", "")
        self.dim = int(meta.get("dim", "0"))
        self.side_dim = int(meta.get("side_dim", "0"))  # 0: embeddings only
        self.side_stage = meta.get("side_stage", "")

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

    def check_side(self, side: tuple[np.ndarray, np.ndarray] | None) -> None:
        """NearsightError when this re-ranker needs stage features that ``side`` does not
        give (or gives at another width)."""
        if not self.side_dim:
            return
        if side is None:
            raise NearsightError(
                f"re-ranker {self.path} scores by the model's {self.side_stage or 'stage'} "
                "features too, and these candidates come without them (a gallery stores them "
                "with nearsight rerank features; Python: evaluate_reranked(..., side=...))"
            )
        if side[0].shape[-1] != self.side_dim or side[1].shape[-1] != self.side_dim:
            raise NearsightError(
                f"re-ranker {self.path} takes {self.side_dim}-d stage features, got "
                f"{side[0].shape[-1]}-d"
            )

    def check_gallery(
        self, folder: str | os.PathLike[str], model_sha256: str | None
    ) -> StageStore | None:
        """The stage features of gallery ``folder`` this re-ranker needs, of the same model
        (NearsightError when it stores none or others); None for an embeddings-only file."""
        if not self.side_dim:
            return None
        from nearsight.search.rerank.stage_store import open_stage_store

        store = open_stage_store(folder)
        fix = f"nearsight rerank features --gallery {folder} --stage {self.side_stage}"
        if store is None or store.stage != self.side_stage:
            raise NearsightError(
                f"re-ranker {self.path} scores by the model's {self.side_stage} features too, "
                f"and gallery {folder} stores none: store them with {fix}"
            )
        if store.dim != self.side_dim or store.model_sha256 != model_sha256:
            raise NearsightError(
                f"gallery {folder} stores {store.dim}-d {store.stage} features of model "
                f"{store.model_sha256[:12]}, not the {self.side_dim}-d ones of its model this "
                f"re-ranker takes: store them again with {fix}"
            )
        return store

    def scores(
        self,
        queries: np.ndarray,
        candidates: np.ndarray,
        side: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> np.ndarray:
        """float32 [Q, N] scores of each query's candidates [Q, N, D] (higher: likelier the
        same class), at most :data:`MAX_RUN_PAIRS` pairs per onnxruntime call. ``side``: the
        stage features of the queries [Q, F] and candidates [Q, N, F] (format 2 only)."""
        self.check_side(side)
        q, n = candidates.shape[:2]
        out = np.empty((q, n), dtype=np.float32)
        step = max(1, MAX_RUN_PAIRS // max(n, 1))
        arrays = (queries, candidates, *(side if side is not None and self.side_dim else ()))
        names = INPUTS + (SIDE_INPUTS if self.side_dim else ())
        for start in range(0, q, step):
            block = slice(start, start + step)
            feed = {
                name: np.ascontiguousarray(array[block], dtype=np.float32)
                for name, array in zip(names, arrays, strict=True)
            }
            (out[block],) = self._session.run([OUTPUT], feed)
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
    side: tuple[np.ndarray, np.ndarray] | None = None,
    reranker: PairwiseReranker | None = None,
) -> np.ndarray:
    """[Q, N] distances for :func:`nearsight.search.rerank.pipeline.rerank`: minus the scores
    of the first ``depth`` candidates, inf for the rest (they keep the base order after them)
    and for missing ones. ``model_sha256``: the embedding model of the vectors (None: vectors
    of no recorded model, as in a bench's matrix; not checked). ``side``: the stage features
    of the queries [Q, F] and candidates [Q, N, F] (zeros for missing ones), for a format-2
    file. ``reranker``: the file of ``params``, when the caller opened it for this search."""
    if reranker is None:
        reranker = load_reranker(str(params["model"]))
    reranker.check_for(model_sha256, queries.shape[1])
    reranker.check_side(side)
    depth = min(int(params["depth"]), vectors.shape[1])
    head = vectors[:, :depth]  # a missing candidate's vector is zeros already (the pipeline)
    if side is not None:
        side = (side[0], side[1][:, :depth])
    distances = np.full(valid.shape, np.inf)
    distances[:, :depth] = -reranker.scores(queries, head, side).astype(np.float64)
    return distances if valid.all() else np.where(valid, distances, np.inf)
