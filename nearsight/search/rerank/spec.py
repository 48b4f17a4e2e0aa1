"""Parse `none|aqe|dba|kreciprocal|dba+aqe[:key=value,...]` into a RerankSpec."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# depth: how many base-search candidates are re-ranked (at least the answer's k, at most
# MAX_DEPTH)
DEFAULTS: dict[str, dict[str, float]] = {
    "none": {},
    "aqe": {"k": 2, "alpha": 3.0, "depth": 100},
    "dba": {"k": 2, "alpha": 3.0, "depth": 100},
    "dba+aqe": {"k": 2, "alpha": 3.0, "depth": 100},
    "kreciprocal": {"k1": 20, "k2": 6, "lambda": 0.3, "depth": 100},
}
_INTS = {"k", "k1", "k2", "depth"}
# bounds a request can ask for: k-reciprocal costs O(depth^3) per query
MAX_DEPTH = 400  # candidates re-ranked per query, whatever the answer's k
_MAX = {"depth": MAX_DEPTH, "k": 64, "k1": 200, "k2": 200, "alpha": 100.0}


@dataclass(frozen=True)
class RerankSpec:
    method: str
    params: dict[str, float] = field(default_factory=dict)

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


NONE = RerankSpec("none")


def _number(value: float) -> str:
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
    return RerankSpec(method, params)
