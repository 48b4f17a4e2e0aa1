"""The one strict check of the loss and sampler registries: a registered class's public
parameters, and keyword arguments checked against them (unknown or missing ones are errors
that list the valid ones)."""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from typing import Any

REQUIRED = inspect.Parameter.empty  # the default of a parameter that has none


def init_parameters(cls: type[Any], skip: Iterable[str] = ()) -> dict[str, Any]:
    """``cls.__init__``'s named parameters (not ``self``, not ``skip``) -> their defaults
    (:data:`REQUIRED` for the ones without)."""
    skipped = {"self", *skip}
    signature = inspect.signature(cls.__init__)
    return {
        key: param.default
        for key, param in signature.parameters.items()
        if key not in skipped and param.kind in (param.KEYWORD_ONLY, param.POSITIONAL_OR_KEYWORD)
    }


def check_parameters(
    kind: str,
    name: str,
    valid: Mapping[str, Any],
    params: Mapping[str, Any],
    error: type[Exception],
) -> None:
    """Raise ``error`` when ``params`` holds a key ``valid`` lacks, or lacks a required one."""
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise error(
            f"{kind} {name!r} has no parameter {', '.join(map(repr, unknown))}; "
            f"valid parameters: {', '.join(valid) or '(none)'}"
        )
    missing = [key for key, default in valid.items() if default is REQUIRED and key not in params]
    if missing:
        raise error(f"{kind} {name!r} needs parameter(s) {', '.join(missing)}")
