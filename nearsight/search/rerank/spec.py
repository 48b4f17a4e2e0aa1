"""Parse `none|aqe|dba|kreciprocal|dba+aqe|pairwise[:key=value,...]` into a RerankSpec.

Every parameter is a number except pairwise's ``model``: the path of a re-ranker ONNX file
(``nearsight rerank train``), taken as text up to the next comma."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# depth: how many base-search candidates are re-ranked (at most MAX_DEPTH; the search route
# re-ranks exactly that many whatever k, so its pages agree; evaluation at least k)
DEFAULTS: dict[str, dict[str, float | str]] = {
    "none": {},
    "aqe": {"k": 2, "alpha": 3.0, "depth": 100},
    "dba": {"k": 2, "alpha": 3.0, "depth": 100},
    "dba+aqe": {"k": 2, "alpha": 3.0, "depth": 100},
    "kreciprocal": {"k1": 20, "k2": 6, "lambda": 0.3, "depth": 100},
    # a learned scorer of (query, candidate) pairs; model= is required, depth as trained
    "pairwise": {"model": "", "depth": 20},
}
_TEXTS = {"model"}
_INTS = {"k", "k1", "k2", "depth"}
# bounds a request can ask for: k-reciprocal costs O(depth^3) per query
MAX_DEPTH = 400  # candidates re-ranked per query, whatever the answer's k
_MAX = {"depth": MAX_DEPTH, "k": 64, "k1": 200, "k2": 200, "alpha": 100.0}


@dataclass(frozen=True)
class RerankSpec:
    method: str
    params: dict[str, float | str] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.method != "none"

    @property
    def depth(self) -> int:
        """Base-search candidates re-ranked per query (0 for ``none``)."""
        return int(self.params.get("depth", 0))

    def __str__(self) -> str:
        """The spec in the form :func:`parse_rerank` reads (stored in gallery meta)."""
        if not self.params:
            return self.method
        values = ",".join(f"{key}={_number(value)}" for key, value in self.params.items())
        return f"{self.method}:{values}"

    @property
    def shown(self) -> str:
        """The spec as a server shows it to its clients (REST answers, the page): a pairwise
        re-ranker's file by its name only, never the server's path to it."""
        if "model" not in self.params:
            return str(self)
        model = str(self.params["model"])
        return str(RerankSpec(self.method, {**self.params, "model": _file_name(model)}))


NONE = RerankSpec("none")


def _file_name(path: str) -> str:
    return path.replace("\\", "/").rstrip("/").rpartition("/")[2] or path


def _number(value: float | str) -> str:
    if isinstance(value, str):
        return value
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def parse_rerank(text: str | RerankSpec | None) -> RerankSpec:
    """Parse a re-rank spec; raise ValueError with a one-line message on bad input. None and
    a RerankSpec pass through (None: ``none``)."""
    if text is None:
        return NONE
    if isinstance(text, RerankSpec):
        return text
    if not isinstance(text, str):
        raise ValueError(f"a rerank spec is text like 'aqe:k=2,alpha=3', not {type(text).__name__}")
    method, _, rest = text.strip().partition(":")
    method = method.strip().lower()
    if method not in DEFAULTS:
        raise ValueError(f"unknown rerank method {method!r}; choose one of {'|'.join(DEFAULTS)}")
    params = dict(DEFAULTS[method])
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in params:
            raise ValueError(f"bad rerank parameter {item!r} for {method}; known: {sorted(params)}")
        if key in _TEXTS:
            params[key] = _text_value(key, value)
            continue
        try:
            num = int(value) if key in _INTS else float(value)
        except ValueError:
            raise ValueError(f"rerank parameter {key} needs a number, got {value!r}") from None
        if (
            not math.isfinite(num)
            or num < 0
            or (key == "lambda" and num > 1)
            or (key in _INTS and num < 1)
            or num > _MAX.get(key, float("inf"))
        ):
            top = f" (at most {_number(_MAX[key])})" if key in _MAX else ""
            raise ValueError(f"rerank parameter {key}={value} is out of range{top}")
        params[key] = num
    if method == "pairwise" and not params["model"]:
        raise ValueError(
            "pairwise needs its model: pairwise:model=FILE.onnx (from nearsight rerank train)"
        )
    return RerankSpec(method, params)


def _text_value(key: str, value: str) -> str:
    value = value.strip()
    if not value or any(ord(char) < 32 for char in value) or len(value) > 4096:
        raise ValueError(f"rerank parameter {key} needs a file path, got {value!r}")
    return value


def request_rerank(text: str, served: RerankSpec) -> RerankSpec:
    """A remote request's re-ranking (REST's ``rerank`` field): any spec, except that a pairwise
    one runs only the server's own re-ranker file (``serve --rerank pairwise:model=FILE``), so a
    request never makes the server open a file it names. ``pairwise`` or ``pairwise:depth=N``
    without ``model=`` means the server's. ValueError (one line) otherwise."""
    method = text.strip().partition(":")[0].strip().lower()
    if method != "pairwise":
        return parse_rerank(text)
    if served.method != "pairwise":
        raise ValueError(
            "this server has no pairwise re-ranker (start it with serve --rerank "
            "pairwise:model=FILE)"
        )
    own = str(served.params["model"])
    rest = text.strip().partition(":")[2]
    given = [p.strip() for p in rest.split(",") if p.strip()]
    if any(p.partition("=")[0].strip() == "model" for p in given):
        spec = parse_rerank(text)
        if spec.params["model"] not in (own, _file_name(own)):  # its path, or the name shown
            raise ValueError("a request may use only the server's pairwise re-ranker: omit model=")
        return RerankSpec("pairwise", {**spec.params, "model": own})
    return parse_rerank(f"pairwise:{','.join([f'model={own}', *given])}")
