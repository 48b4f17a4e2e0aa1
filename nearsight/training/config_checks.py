"""Checking a training configuration and filling its automatic settings: every value has its
field's type and a meaning (:func:`validate`), and ``None``/``"auto"`` settings are chosen from
the starting point (:func:`resolve_defaults`), so that a run's ``config.yaml`` says what ran.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import TYPE_CHECKING, Any

from nearsight.core.errors import NearsightError
from nearsight.data.metrics.nmi import NMI_AVERAGES
from nearsight.models.embedding_config import (
    FEATURE_NORMS,
    check_arch,
    check_heads,
    resolve_feature_norm,
    resolve_pooling,
)
from nearsight.models.trunks import trunk_family

# the training config's `compile` (nearsight/training/compiled.py): auto, off or a torch mode
COMPILE_SETTINGS = (
    "auto",
    "off",
    "default",
    "reduce-overhead",
    "max-autotune-no-cudagraphs",
    "max-autotune",
)

if TYPE_CHECKING:
    from nearsight.training.config_schema import TrainConfig


class ConfigError(NearsightError, ValueError):
    """A configuration file or override that does not fit the schema."""


def _check_types(node: Any, where: str) -> None:
    """Each value has its field's type (an int is accepted, and converted, for a float)."""
    hints = typing.get_type_hints(type(node))
    for item in dataclasses.fields(node):
        value = getattr(node, item.name)
        path = f"{where}.{item.name}" if where else item.name
        if dataclasses.is_dataclass(value):
            _check_types(value, path)
            continue
        expected = hints[item.name]
        options = (
            typing.get_args(expected)
            if typing.get_origin(expected) is types.UnionType
            else (expected,)
        )
        if value is None and type(None) in options:
            continue
        bases = tuple(typing.get_origin(o) or o for o in options if o is not type(None))
        if float in bases and isinstance(value, int) and not isinstance(value, bool):
            setattr(node, item.name, float(value))
            continue
        # bool is an int subclass: `steps: true` must not pass as an integer
        is_bool_mismatch = isinstance(value, bool) and bool not in bases
        if is_bool_mismatch or not isinstance(value, bases):
            names = " or ".join(getattr(o, "__name__", str(o)) for o in options)
            raise ConfigError(f"config {path} must be {names}, got {value!r}")


def validate(config: TrainConfig) -> None:
    from nearsight.training.losses.registry import LOSSES
    from nearsight.training.samplers import SAMPLERS

    _check_types(config, "")
    for name in ("amp", "channels_last"):
        if isinstance(getattr(config, name), str) and getattr(config, name) != "auto":
            raise ConfigError(
                f"config {name} must be auto, true or false, got {getattr(config, name)!r}"
            )
    if isinstance(config.compile, str) and config.compile not in COMPILE_SETTINGS:
        raise ConfigError(
            f"config compile must be one of {', '.join(COMPILE_SETTINGS)}, got {config.compile!r}"
        )
    if config.loss.name not in LOSSES:
        raise ConfigError(
            f"unknown loss {config.loss.name!r}; valid losses: {', '.join(sorted(LOSSES))}"
        )
    try:
        check_arch(config.model.arch)  # a timm name timm does not have: a one-line error
    except NearsightError as error:
        raise ConfigError(f"unknown model.arch {config.model.arch!r}: {error}") from None
    if config.sampler.name != "auto" and config.sampler.name not in SAMPLERS:
        raise ConfigError(
            f"unknown sampler {config.sampler.name!r}; valid samplers: auto, "
            + ", ".join(sorted(SAMPLERS))
        )
    if config.steps is None and config.epochs is None and config.time_limit_s is None:
        raise ConfigError("set steps, epochs or time_limit_s")
    if config.time_limit_s is not None and config.time_limit_s <= 0:
        raise ConfigError(f"time_limit_s must be positive, got {config.time_limit_s}")
    threads = config.cpu_threads
    if threads not in ("cores", "measured") and not (
        isinstance(threads, int) and not isinstance(threads, bool) and threads > 0
    ):
        raise ConfigError(
            f"cpu_threads must be cores, measured or a number of threads, got {threads!r}"
        )
    expected = config.expected_steps_per_s
    if expected is not None and expected <= 0:
        raise ConfigError(f"expected_steps_per_s must be positive, got {expected}")
    val = config.data.val_classes
    if val < 0 or (val >= 1 and val != int(val)):
        raise ConfigError(
            f"data.val_classes must be a number of classes or a share below 1, got {val}"
        )
    for name, value in (("steps", config.steps), ("epochs", config.epochs)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    if config.device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"device must be auto, cpu or cuda, got {config.device!r}")
    if config.optim.name not in ("adam", "adamw", "sgd"):
        raise ConfigError(f"optim.name must be adam, adamw or sgd, got {config.optim.name!r}")
    if config.optim.schedule not in ("auto", "constant", "step", "cosine"):
        raise ConfigError(
            f"optim.schedule must be auto, constant, step or cosine, got {config.optim.schedule!r}"
        )
    decay_start = config.optim.decay_start
    if not isinstance(decay_start, int | float) or not 0 <= decay_start < 1:
        raise ConfigError(f"optim.decay_start must be in [0, 1), got {decay_start!r}")
    if config.sampler.classes_per_batch < 2 or config.sampler.per_class < 1:
        raise ConfigError("a batch needs at least 2 classes and 1 image per class")
    if config.data.image_size < 16:
        raise ConfigError(f"image size must be at least 16, got {config.data.image_size}")
    # a zero period would be a modulo by zero mid-run; a negative count a DataLoader error
    for name, value in (
        ("eval_every", config.eval_every),
        ("save_every", config.save_every),
        ("log_every", config.log_every),
        ("data.eval_batch_size", config.data.eval_batch_size),
    ):
        if value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value}")
    if config.model.feature_norm not in FEATURE_NORMS:
        raise ConfigError(
            f"model.feature_norm must be one of {', '.join(FEATURE_NORMS)}, "
            f"got {config.model.feature_norm!r}"
        )
    resolve_defaults(config)  # here, so config.yaml says what ran
    try:
        config.model.heads = check_heads(
            config.model.heads, config.model.embedding, config.model.arch
        )
    except NearsightError as error:
        raise ConfigError(f"model.{error}") from None
    if config.optim.freeze_trunk_steps < 0:
        raise ConfigError(
            f"optim.freeze_trunk_steps must be 0 or more, got {config.optim.freeze_trunk_steps}"
        )
    clip = config.optim.clip_grad_value
    if clip is not None and not clip > 0:
        raise ConfigError(f"optim.clip_grad_value must be positive (or null), got {clip}")
    if config.data.workers < 0:
        raise ConfigError(f"data.workers must be 0 or more, got {config.data.workers}")
    if not config.ks or any(k < 1 for k in config.ks):
        raise ConfigError(f"ks must be positive integers, got {config.ks}")
    if config.nmi_average not in NMI_AVERAGES:
        raise ConfigError(
            f"nmi_average must be one of {', '.join(NMI_AVERAGES)}, got {config.nmi_average!r}"
        )


# the settings that follow the starting point: (from pretrained weights, from scratch). From
# scratch every layer is new, so the trunk trains at the head's rate, BatchNorm learns its
# statistics and the rate warms up then decays; from pretrained weights the papers' fine-tuning
# settings apply (a slow trunk, frozen BatchNorm statistics, a constant rate).
STARTING_POINT_DEFAULTS: dict[str, tuple[Any, Any]] = {
    "model.freeze_bn": (True, False),
    "optim.head_lr": (1e-4, 1e-3),
    "optim.schedule": ("constant", "cosine"),
}
PRETRAINED_TRUNK_LR = 1e-5
# from scratch, the warmup lasts ~5% of the steps, between 1 and this many
MAX_AUTO_WARMUP = 50
UNKNOWN_LENGTH_WARMUP = 20  # a run bounded by epochs or time: its step count is not known yet


def resolve_defaults(config: TrainConfig) -> None:
    """Fill every automatic setting (None or "auto") from the starting point, in place, and
    record their names in ``config.auto``. Values set explicitly are kept; a saved config has
    nothing left to resolve, so resolving it again changes nothing."""
    chosen: list[str] = []
    model, optim = config.model, config.optim
    family = trunk_family(model.arch)
    if model.pretrained == "auto":
        model.pretrained = family.cached_pretrained(model.arch)
        chosen.append("model.pretrained")
    if model.pooling == "auto":
        model.pooling = resolve_pooling(model.pooling, model.arch)
        chosen.append("model.pooling")
    if config.data.resize is None:  # a timm trunk's: its pretrained config's crop share
        resize = family.test_resize(model.arch, config.data.image_size)
        if resize is not None:
            config.data.resize = resize
            chosen.append("data.resize")
    scratch = model.pretrained == "none"
    for dotted, (pretrained_value, scratch_value) in STARTING_POINT_DEFAULTS.items():
        section, name = dotted.split(".")
        node = getattr(config, section)
        if getattr(node, name) in (None, "auto"):
            setattr(node, name, scratch_value if scratch else pretrained_value)
            chosen.append(dotted)
    if optim.lr is None:
        optim.lr = optim.head_lr if scratch else PRETRAINED_TRUNK_LR
        chosen.append("optim.lr")
    if optim.warmup_steps is None:
        if not scratch:
            optim.warmup_steps = 0
        elif config.steps is None or config.epochs is not None:
            optim.warmup_steps = UNKNOWN_LENGTH_WARMUP
        else:
            optim.warmup_steps = min(MAX_AUTO_WARMUP, max(1, config.steps // 20))
        chosen.append("optim.warmup_steps")
    if model.feature_norm == "auto":
        model.feature_norm = resolve_feature_norm(model.feature_norm, model.pretrained)
        chosen.append("model.feature_norm")
    config.auto = sorted(set(config.auto) | set(chosen))
