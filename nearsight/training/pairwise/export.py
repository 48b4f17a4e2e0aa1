"""Writing a trained :class:`PairScorer` as the ONNX file ``pairwise:model=FILE`` runs.

One file: inputs ``query`` [B, D] and ``candidates`` [B, N, D], output ``scores`` [B, N], B and N
dynamic; metadata ``artifact``, ``format`` (nearsight.search.rerank.pairwise reads them), ``dim``,
``embedding_model_sha256`` (the model it was trained for) and what the training measured.
Written to a temporary name and renamed after onnxruntime's output matched torch's: never
half-written.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import torch

from nearsight.core.errors import NearsightError
from nearsight.training.pairwise.scorer import PairScorer

# the file's contract, as nearsight.search.rerank.pairwise reads it (training does not import
# search; tests/training/test_pairwise.py checks the two agree)
ARTIFACT = "nearsight-pairwise-reranker"
FORMAT = "1"
OPSET = 17
PARITY_ATOL = 1e-5


def export_scorer(
    scorer: PairScorer,
    out: str | os.PathLike[str],
    embedding_model_sha256: str,
    extra: Mapping[str, str] | None = None,
) -> float:
    """Write ``scorer`` (computing in float64) to ``out``; return :func:`parity` against the
    float64 torch scorer (NearsightError above :data:`PARITY_ATOL`; nothing written then)."""
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    # the file computes in float64: the list features compare and divide near-equal cosines,
    # where float32 kernels of torch and onnxruntime part by more than the parity allows
    scorer = copy.deepcopy(scorer).double().eval()
    example = _lists(2, 7, scorer.dim, seed=0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter,
            warnings.simplefilter("ignore", FutureWarning)  # as nearsight.models.export uses
            torch.onnx.export(
                scorer,
                example,
                str(tmp),
                dynamo=False,
                export_params=True,
                opset_version=OPSET,
                do_constant_folding=True,
                input_names=["query", "candidates"],
                output_names=["scores"],
                dynamic_axes={
                    "query": {0: "B"},
                    "candidates": {0: "B", 1: "N"},
                    "scores": {0: "B", 1: "N"},
                },  # fmt: skip
            )
        model = onnx.load(str(tmp))
        metadata = {
            "artifact": ARTIFACT,
            "format": FORMAT,
            "dim": str(scorer.dim),
            "embedding_model_sha256": embedding_model_sha256,
            **(extra or {}),
        }
        for key, value in metadata.items():
            entry = model.metadata_props.add()
            entry.key, entry.value = key, str(value)
        model.doc_string = (
            "nearsight pairwise re-ranker: query [B,D], candidates [B,N,D] -> scores [B,N]"
        )
        onnx.checker.check_model(model)
        onnx.save_model(model, str(tmp), save_as_external_data=False)
        worst = parity(scorer, tmp)
        if not worst <= PARITY_ATOL:
            raise NearsightError(
                f"the exported re-ranker differs from torch by {worst:.2e} (> {PARITY_ATOL})"
            )
        os.replace(tmp, out)
        return worst
    finally:
        tmp.unlink(missing_ok=True)


def parity(scorer: PairScorer, path: str | os.PathLike[str]) -> float:
    """max |onnxruntime(CPU) - torch| over seeded random lists of several shapes."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for seed, (b, n) in enumerate([(1, 1), (1, 20), (5, 20), (3, 57), (2, 400)]):
        query, candidates = _lists(b, n, scorer.dim, seed)
        with torch.inference_mode():
            expected = scorer(query, candidates).numpy()
        (got,) = session.run(["scores"], {"query": query.numpy(), "candidates": candidates.numpy()})
        if got.shape != expected.shape or not np.isfinite(expected).all():
            return float("inf")
        worst = max(worst, float(np.abs(got - expected).max()))
    return worst


def _lists(b: int, n: int, dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit query [b, dim] and candidates [b, n, dim] near it (as a search's top n are)."""
    generator = torch.Generator().manual_seed(seed)
    query = torch.nn.functional.normalize(torch.randn(b, dim, generator=generator), dim=-1)
    noise = torch.randn(b, n, dim, generator=generator)
    candidates = torch.nn.functional.normalize(query.unsqueeze(1) * 3 + noise / dim**0.5, dim=-1)
    return query, candidates
