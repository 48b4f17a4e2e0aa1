"""Writing a trained :class:`PairScorer` as the ONNX file ``pairwise:model=FILE`` runs.

One file: inputs ``query`` [B, D] and ``candidates`` [B, N, D], output ``scores`` [B, N], B and N
dynamic; metadata ``artifact``, ``format`` (nearsight.search.rerank.pairwise reads them), ``dim``,
``embedding_model_sha256`` (the model it was trained for) and what the training measured. A
scorer of a trunk stage's features too (``side_dim`` > 0) is format 2: two more inputs,
``query_side`` [B, F] and ``candidate_side`` [B, N, F], and metadata ``side_dim`` (and
``side_stage``, which the caller records: the stage the features come from).
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
FORMAT_SIDE = "2"  # with the stage-feature inputs
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
    example = _lists(2, 7, scorer.dim, seed=0, side_dim=scorer.side_dim)
    names = ["query", "candidates", "query_side", "candidate_side"][: len(example)]
    axes = {"query": {0: "B"}, "candidates": {0: "B", 1: "N"}, "scores": {0: "B", 1: "N"},
            "query_side": {0: "B"}, "candidate_side": {0: "B", 1: "N"}}  # fmt: skip
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
                input_names=names,
                output_names=["scores"],
                dynamic_axes={name: axes[name] for name in [*names, "scores"]},
            )
        model = onnx.load(str(tmp))
        metadata = {
            "artifact": ARTIFACT,
            "format": FORMAT_SIDE if scorer.side_dim else FORMAT,
            "dim": str(scorer.dim),
            **({"side_dim": str(scorer.side_dim)} if scorer.side_dim else {}),
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
        inputs = _lists(b, n, scorer.dim, seed, side_dim=scorer.side_dim)
        with torch.inference_mode():
            expected = scorer(*inputs).numpy()
        names = [i.name for i in session.get_inputs()]
        (got,) = session.run(["scores"], {k: v.numpy() for k, v in zip(names, inputs, strict=True)})
        if got.shape != expected.shape or not np.isfinite(expected).all():
            return float("inf")
        worst = max(worst, float(np.abs(got - expected).max()))
    return worst


def _lists(b: int, n: int, dim: int, seed: int, side_dim: int = 0) -> tuple[torch.Tensor, ...]:
    """Unit query [b, dim] and candidates [b, n, dim] near it (as a search's top n are); with
    ``side_dim``, non-negative stage features [b, side_dim] and [b, n, side_dim] too (pooled
    post-ReLU maps), one candidate's zero (a missing one)."""
    generator = torch.Generator().manual_seed(seed)
    query = torch.nn.functional.normalize(torch.randn(b, dim, generator=generator), dim=-1)
    noise = torch.randn(b, n, dim, generator=generator)
    candidates = torch.nn.functional.normalize(query.unsqueeze(1) * 3 + noise / dim**0.5, dim=-1)
    if not side_dim:
        return query, candidates
    query_side = torch.rand(b, side_dim, generator=generator)
    candidate_side = query_side.unsqueeze(1) + torch.rand(b, n, side_dim, generator=generator)
    candidate_side[:, -1] = 0.0 if n > 1 else candidate_side[:, -1]
    return query, candidates, query_side, candidate_side
