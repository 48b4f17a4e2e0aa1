"""Parse `none|aqe|dba|kreciprocal|dba+aqe[:key=value,...]` into a RerankSpec."""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULTS: dict[str, dict[str, float]] = {
    "none": {},
    "aqe": {"k": 2, "alpha": 3.0},
    "dba": {"k": 2, "alpha": 3.0},
    "dba+aqe": {"k": 2, "alpha": 3.0},
    "kreciprocal": {"k1": 20, "k2": 6, "lambda": 0.3},
}
_INTS = {"k", "k1", "k2"}


@dataclass(frozen=True)
class RerankSpec:
    method: str
    params: dict[str, float] = field(default_factory=dict)


def parse_rerank(text: str) -> RerankSpec:
    """Parse a re-rank spec; raise ValueError with a one-line message on bad input."""
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
        if num < 0 or (key == "lambda" and num > 1) or (key in _INTS and num < 1):
            raise ValueError(f"rerank parameter {key}={value} is out of range")
        params[key] = num
    return RerankSpec(method, params)
