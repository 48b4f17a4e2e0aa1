"""A gallery's stored trunk-stage features, for a pairwise re-ranker that scores by them.

``nearsight rerank features --gallery G --stage layer3`` embeds the gallery's items once more
through its own model with the stage output (nearsight.search.rerank.stage_features) and
writes four files beside the gallery's own:
- ``stage_features.npy``: float16 [M, C], one row per item (float16: half the bytes; the
  re-ranker centres and normalises them, so the rounding moves scores by ~1e-3 at most);
- ``stage_features_ids.npy``: int64 [M], the items' ids, ascending;
- ``stage_model.onnx``: the gallery's model with the stage output added, which embeds a query
  image and gives its stage features in one onnxruntime run (the serving side has no onnx
  package to add the output itself: nearsight.search.rerank.stage_query);
- ``stage_features.json``: the stage, its width, the count, the model's sha256 and the stage
  model's file name and sha256.
The JSON is written last: a reader that finds it finds the files it describes. Items added
to the gallery later have no row: a search whose candidates include one is refused in one
line (run the command again), never scored as if its features were zero.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from nearsight.core.arrays import load_array
from nearsight.core.errors import NearsightError

FEATURES, IDS, META = "stage_features.npy", "stage_features_ids.npy", "stage_features.json"
MODEL = "stage_model.onnx"
_cache: dict[tuple[str, int], StageStore] = {}
_lock = threading.Lock()


class StageStore:
    """The stage features of a gallery's items, memory-mapped, by item id."""

    def __init__(self, folder: Path, meta: dict) -> None:
        self.folder = folder
        self.stage, self.dim = str(meta["stage"]), int(meta["dim"])
        self.model_sha256 = str(meta["model_sha256"])
        # absent in a store written before image queries could be re-ranked with it
        self.stage_model = meta.get("stage_model")
        self.stage_model_sha256 = str(meta.get("stage_model_sha256", ""))
        # the stage models that embed query images, by providers and optimisation
        # (nearsight.search.rerank.stage_query opens them)
        self.query_models: dict[tuple[tuple[str, ...] | None, str], Any] = {}
        self.query_lock = threading.Lock()
        self.features = load_array(folder / FEATURES, mmap_mode="r")
        self.ids = load_array(folder / IDS)
        # the same memory map as a plain ndarray: its fancy indexing skips np.memmap's
        # Python-level __getitem__ (a search gathers a few rows per call)
        self._table = self.features.view(np.ndarray)
        if self.features.shape != (int(meta["count"]), self.dim) or len(self.ids) != len(
            self.features
        ):
            raise NearsightError(f"{folder / META} does not describe its arrays: store again")

    def side_of(self, ids: np.ndarray) -> np.ndarray:
        """float32 [len(ids), C] features of items ``ids`` (one-line NearsightError for an
        item without a row)."""
        ids = np.asarray(ids, dtype=np.int64)
        rows = np.searchsorted(self.ids, ids)
        rows = np.minimum(rows, len(self.ids) - 1)
        missing = self.ids[rows] != ids if len(self.ids) else np.ones(len(ids), bool)
        if missing.any():
            raise NearsightError(
                f"gallery {self.folder} stores no {self.stage} features for item "
                f"{int(ids[missing][0])} (added since they were stored): run nearsight rerank "
                f"features --gallery {self.folder} --stage {self.stage} again"
            )
        return widen_halves(self._table[rows])


def widen_halves(rows: np.ndarray) -> np.ndarray:
    """float32 copy of float16 ``rows`` [N, F], the same values as ``astype``: onnxruntime's
    Cast converts with the CPU's half-precision instructions, numpy's astype one value at a
    time (about a third of the time for a search's 21 x 1,024 features)."""
    if rows.ndim != 2 or not rows.size:
        return rows.astype(np.float32)
    (out,) = _half_widener().run(None, {"halves": np.ascontiguousarray(rows)})
    return out


# A one-node ONNX graph, Cast float16 [N, F] -> float32 (IR 8, opset 17), as bytes: the
# serving install has onnxruntime but not the onnx package that would build it
# (tests/search/test_stage_store_widen.py builds it with onnx.helper and compares).
HALF_WIDENER_ONNX = (
    b'\x08\x08\x12\tnearsight:b\n!\n\x06halves\x12\x06floats"\x04Cast*\t\n\x02to\x18\x01'
    b"\xa0\x01\x02\x12\x05widenZ\x1a\n\x06halves\x12\x10\n\x0e\x08\n\x12\n\n\x03\x12\x01N"
    b"\n\x03\x12\x01Fb\x1a\n\x06floats\x12\x10\n\x0e\x08\x01\x12\n\n\x03\x12\x01N\n\x03"
    b"\x12\x01FB\x04\n\x00\x10\x11"
)


@functools.cache
def _half_widener() -> Any:
    """The onnxruntime session of :data:`HALF_WIDENER_ONNX` (made once per process)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # a few KB per call: no thread pool
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(HALF_WIDENER_ONNX, options, providers=["CPUExecutionProvider"])


def open_stage_store(folder: str | os.PathLike[str]) -> StageStore | None:
    """The stage features stored in gallery ``folder``, or None; opened once per version."""
    text = os.path.normpath(os.fspath(folder))  # os.path, not pathlib: once per search
    try:
        stamp = os.stat(os.path.join(text, META)).st_mtime_ns
    except OSError:
        return None
    key = (text, stamp)
    with _lock:
        if key in _cache:
            return _cache[key]
    folder = Path(folder)
    try:
        meta = json.loads((folder / META).read_text())
        store = StageStore(folder, meta)
    except (OSError, ValueError, KeyError) as error:
        raise NearsightError(f"{folder / META}: unreadable stage features ({error})") from None
    with _lock:
        for old in [k for k in _cache if k[0] == key[0]]:
            del _cache[old]
        _cache[key] = store
    return store


def write_stage_store(
    folder: str | os.PathLike[str],
    stage: str,
    model_sha256: str,
    ids: np.ndarray,
    features: np.ndarray,
    stage_model: bytes | None = None,
) -> Path:
    """Write the stage features of items ``ids`` and the serialised ``stage_model`` (the
    gallery's model with the stage output; None: none, so only searches by gallery item can
    re-rank with the store, as in a bench) into gallery ``folder`` (module docstring)."""
    folder = Path(folder)
    ids = np.asarray(ids, dtype=np.int64)
    order = np.argsort(ids, kind="stable")
    rows = np.asarray(features, dtype=np.float16)[order]
    if not np.isfinite(rows).all():
        raise NearsightError("stage features out of float16's range: not stored")
    (folder / META).unlink(missing_ok=True)  # readers see no store while the arrays change
    for name, array in ((FEATURES, rows), (IDS, ids[order])):
        tmp = folder / f".{name}.tmp"
        with open(tmp, "wb") as handle:
            np.save(handle, array)
        os.replace(tmp, folder / name)
    meta = {"stage": stage, "dim": int(rows.shape[1]), "count": int(len(rows)),
            "model_sha256": model_sha256}  # fmt: skip
    if stage_model is None:
        (folder / MODEL).unlink(missing_ok=True)
    else:
        tmp = folder / f".{MODEL}.tmp"
        tmp.write_bytes(stage_model)
        os.replace(tmp, folder / MODEL)
        meta |= {"stage_model": MODEL,
                 "stage_model_sha256": hashlib.sha256(stage_model).hexdigest()}  # fmt: skip
    tmp = folder / f".{META}.tmp"
    tmp.write_text(json.dumps(meta))
    os.replace(tmp, folder / META)
    return folder / META
