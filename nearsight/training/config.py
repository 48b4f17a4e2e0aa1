"""The training configuration: defaults, a YAML file on top, command-line overrides last.

The fully resolved configuration is what a run saves as ``config.yaml``; loading that file
gives back the same :class:`TrainConfig`, so a run can always be repeated or resumed.
Unknown keys are errors (a typo must not silently train something else).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from nearsight.training.config_checks import ConfigError, validate
from nearsight.training.config_schema import (
    DataConfig,
    LossConfig,
    ModelConfig,
    OptimConfig,
    SamplerConfig,
    TrainConfig,
)

# the schema's classes, loaded and validated here
__all__ = ["ConfigError", "DataConfig", "LossConfig", "ModelConfig", "OptimConfig",
           "SamplerConfig", "TrainConfig", "load_config", "validate"]  # fmt: skip

PAPER_KEY = "paper"
# the recipe `nearsight demo` trains (configs/demo.yaml): shipped beside the reproductions,
# measured by bench/demo_recipe.py rather than compared with a paper
DEMO_RECIPE = "demo"


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML follows YAML 1.1, where ``1e-4`` (no dot) is a string; configs mean a number."""


_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def parse_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass


def _merge(target: Any, values: dict[str, Any], where: str) -> Any:
    """Copy ``values`` into the dataclass ``target`` recursively, rejecting unknown keys."""
    if not isinstance(values, dict):
        raise ConfigError(
            f"config {where or 'file'} must be a mapping, got {type(values).__name__}"
        )
    names = {f.name: f for f in dataclasses.fields(target)}
    for key, value in values.items():
        path = f"{where}.{key}" if where else key
        if key not in names:
            raise _unknown_key(path, names, f"; valid keys: {', '.join(names)}")
        current = getattr(target, key)
        if dataclasses.is_dataclass(current):
            _merge(current, value, path)
        elif key == "params":
            if not isinstance(value, dict):
                raise ConfigError(f"config {path} must be a mapping")
            setattr(target, key, dict(value))
        else:
            setattr(target, key, value)
    return target


def load_config(
    path: str | Path | None = None, overrides: dict[str, Any] | None = None
) -> TrainConfig:
    """Defaults, then the YAML file at ``path``, then ``overrides`` (dotted keys)."""
    config = TrainConfig()
    if path is not None:
        path = Path(path)
        try:
            values = parse_yaml(_config_text(path)) or {}
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"config file {path} is not UTF-8 text (not a YAML file?)") from None
        except OSError as error:  # a folder, no permission
            raise ConfigError(f"cannot read config file {path}: {error.strerror}") from None
        except yaml.YAMLError as error:
            line = getattr(getattr(error, "problem_mark", None), "line", None)
            at = f" (line {line + 1})" if line is not None else ""
            raise ConfigError(f"config file {path} is not valid YAML{at}") from None
        if isinstance(values, dict):
            # the paper's row a config is compared against: read by nearsight.training.paper,
            # not a training setting
            values.pop(PAPER_KEY, None)
        _merge(config, values, "")
    for dotted, value in (overrides or {}).items():
        apply_override(config, dotted, value)
    validate(config)
    return config


def shipped_configs() -> list[str]:
    """The names of the paper reproductions that ship inside the package (``rll_cub``, ...):
    every shipped recipe but the demo's, each with its ``paper:`` row."""
    folder = resources.files("nearsight.training") / "configs"
    names = (entry.name[:-5] for entry in folder.iterdir() if entry.name.endswith(".yaml"))
    return sorted(name for name in names if name != DEMO_RECIPE)


def _config_text(path: Path) -> str:
    """A file's text, or a shipped config's by its bare name (``rll_cub`` or ``rll_cub.yaml``),
    read through importlib.resources so that it works from a wheel as from a checkout."""
    if path.exists() or len(path.parts) > 1:
        return path.read_text()
    name = path.name if path.suffix == ".yaml" else f"{path.name}.yaml"
    shipped = resources.files("nearsight.training") / "configs" / name
    if not shipped.is_file():
        raise FileNotFoundError(path)
    return shipped.read_text()


def apply_override(config: TrainConfig, dotted: str, value: Any) -> None:
    """Set ``a.b.c`` = value; ``loss.params.x`` and ``sampler.params.x`` may be new keys."""
    *parents, last = dotted.split(".")
    node: Any = config
    for depth, part in enumerate(parents):
        if isinstance(node, dict):
            node = node.setdefault(part, {})
        elif dataclasses.is_dataclass(node) and hasattr(node, part):
            node = getattr(node, part)
        else:
            raise _unknown_key(dotted, _fields(node), at=depth)
    if isinstance(node, dict):
        node[last] = value
    elif dataclasses.is_dataclass(node) and hasattr(node, last):
        setattr(node, last, value)
    else:
        raise _unknown_key(dotted, _fields(node), at=len(parents))


def _fields(node: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(node)] if dataclasses.is_dataclass(node) else []


def _unknown_key(dotted: str, names: Iterable[str], more: str = "", at: int = -1) -> ConfigError:
    """ "unknown config key 'optim.lrr' (did you mean 'optim.lr'?)": the part at position
    ``at`` of the dotted key (default the last) matched against the ``names`` valid there."""
    parts = dotted.split(".")
    at = at % len(parts)
    close = difflib.get_close_matches(parts[at], list(names), n=1)
    hint = ""
    if close:
        hint = f" (did you mean {'.'.join([*parts[:at], close[0], *parts[at + 1 :]])!r}?)"
    return ConfigError(f"unknown config key {dotted!r}{hint}{more}")


def parse_set_option(text: str) -> tuple[str, Any]:
    """``--set optim.lr=1e-4`` -> ("optim.lr", 0.0001); values are parsed as YAML scalars."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set takes KEY=VALUE, got {text!r}")
    try:
        return key.strip(), parse_yaml(raw)
    except yaml.YAMLError:
        raise ConfigError(f"--set {key}: cannot parse value {raw!r}") from None
