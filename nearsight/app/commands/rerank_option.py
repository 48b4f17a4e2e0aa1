"""The ``--rerank`` option that ``search``, ``eval`` and ``serve`` share."""

from __future__ import annotations

import argparse

from nearsight.search.rerank.spec import DEFAULTS, RerankSpec, parse_rerank


def _defaults(params: dict[str, float | str]) -> str:
    return ",".join(f"{k}={v:g}" for k, v in params.items() if not isinstance(v, str))


RERANK_HELP = (
    "re-rank the index's top candidates: none | aqe | dba | dba+aqe | kreciprocal | "
    "pairwise, with parameters after a colon (aqe:k=2,alpha=3; kreciprocal:k1=20,k2=6,"
    "lambda=0.3; pairwise:model=RERANKER.onnx from nearsight rerank train; each takes depth=N "
    "candidates). Default: what the gallery stores (nearsight eval --tune-on VAL --save), else "
    "none. Defaults: " + "; ".join(f"{m}:{_defaults(p)}" for m, p in DEFAULTS.items() if p)
)


def rerank_type(text: str) -> RerankSpec:
    try:
        return parse_rerank(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_rerank_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rerank", type=rerank_type, default=None, metavar="METHOD[:K=V,...]", help=RERANK_HELP
    )
