"""The one description of an embedding model: :class:`ModelSpec`.

Training writes it once into the checkpoint (``model_spec``); export copies it into the ONNX
metadata (one JSON property, ``model_spec``); ``nearsight index build`` records it in the
gallery catalog's meta (``model_spec``); the embedders and the page read it back from there.
No torch here: serving reads specs too.

A model exported elsewhere (any ONNX image-embedding graph, :mod:`nearsight.models.foreign`) has a spec
too: its ``input_name`` and ``output_name`` are set, and ``mean``/``std`` say how it wants its
input normalised, which its embedder does. nearsight's own models normalise inside the graph:
with the ImageNet statistics when ``mean``/``std`` are empty (the torchvision ResNets), or with
the ``mean``/``std`` a timm trunk was pretrained with (CLIP's differ). These fields, ``head``
and a non-bilinear ``interpolation`` are written only when set, so the specs of the ResNets
read as before.

Files written before the spec existed carry its fields under other names;
:func:`spec_from_onnx_metadata`, :func:`spec_from_checkpoint` and :func:`spec_from_gallery_meta`
read those (legacy) fields into a spec, so old checkpoints, models and galleries still load.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nearsight.core.errors import NearsightError

SPEC_KEY = "model_spec"  # the key in checkpoints, ONNX metadata and gallery meta
TIMM_PREFIX = "timm:"  # arch "timm:NAME": a model of timm's catalogue (nearsight.models.timm_trunk)
# avg, max, avgmax (their sum) and gem (generalised mean, p = 3) over a feature map or over a
# transformer's patch tokens; token: a transformer's class token
POOLINGS = ("avg", "max", "avgmax", "gem", "token")
RESOLVED_FEATURE_NORMS = ("none", "batchnorm")
EMBEDDINGS = ("last", "concat")  # the served embedding: the layer4 head's, or all heads'
HEAD_KINDS = ("linear", "none")  # none: the pooled trunk features are the embedding
INTERPOLATIONS = ("bilinear", "bicubic")  # the test-time (and training) resize
# written only when set (foreign models; timm trunks), so older specs read as they were
OPTIONAL_FIELDS = ("input_name", "output_name", "mean", "std")


def is_timm(arch: object) -> bool:
    """Whether ``arch`` (or a ``--model`` value) names a timm model: ``timm:NAME``."""
    return isinstance(arch, str) and arch.startswith(TIMM_PREFIX)


def timm_name(arch: str) -> str:
    """``timm:NAME`` -> ``NAME``."""
    return arch[len(TIMM_PREFIX) :]


def default_resize(image_size: int) -> int:
    """The papers' ratio: resize the short side to 256, then crop 224."""
    return round(image_size * 256 / 224)


@dataclass
class TrunkFields:
    """The fields that describe a network's trunk and heads, in every description of a network:
    the training config's model section (nearsight.training.config_schema.ModelConfig), the
    checkpoint's EmbeddingConfig and :class:`ModelSpec` inherit them (a field added here reaches
    all three)."""

    # any torchvision ResNet of nearsight.models.embedding_config.ARCHS, or timm:NAME (any
    # model of timm's catalogue, nearsight/models/timm_trunk.py)
    arch: str = "resnet50"
    dim: int = 128  # embedding width of each head (see output_dim)
    pooling: str = "avg"  # POOLINGS: avg | max | avgmax | gem | token (a transformer's)
    # standardise the pooled features before the head: none | batchnorm (resolved, never "auto")
    feature_norm: str = "none"
    # trunk stages with an embedding head of `dim`, low to high, ending at the last (a
    # ResNet's layer4; a timm trunk's feature_info stages): the RLL/ICE papers' L, M, H are
    # [layer2, layer3, layer4]
    heads: Sequence[str] = ("layer4",)
    # what is served: last (the last stage's head) | concat (every head, L2-normalised
    # concatenation, dim x len(heads))
    embedding: str = "last"
    head: str = "linear"  # linear (a layer to `dim`) | none (the pooled features, dim = width)


@dataclass
class NetworkFields(TrunkFields):
    """:class:`TrunkFields` and the input the network takes (the training config keeps these in
    its data section, or leaves them to the trunk)."""

    image_size: int = 224  # the square crop the model takes
    interpolation: str = "bilinear"  # how images are resized: bilinear | bicubic
    # per RGB channel: the input is (pixels in [0, 1] - mean) / std; () = ImageNet's. A foreign
    # model's embedder applies them; nearsight's own models do inside the graph.
    mean: Sequence[float] = ()
    std: Sequence[float] = ()


@dataclass
class ModelSpec(NetworkFields):
    """What a model is, as far as anyone who runs it needs to know: :class:`NetworkFields`
    (tuples here, and resolved) and how a file is run. Immutable and hashable once made."""

    heads: tuple[str, ...] = ("layer4",)
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    test_resize: int = 0  # short side before the crop; 0 = default_resize(image_size)
    # a foreign ONNX model (nearsight.models.foreign); "" for nearsight's own
    input_name: str = ""  # its NCHW float image input
    output_name: str = ""  # the embedding output (flattened per image, then L2-normalised)

    def __setattr__(self, name: str, value: Any) -> None:
        # frozen, as dataclass(frozen=True) would make it (which cannot inherit the mutable
        # fields the configs share)
        if self.__dict__.get("_sealed"):
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super().__setattr__(name, value)

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, field.name) for field in dataclasses.fields(self)))

    def __post_init__(self) -> None:
        for name in ("dim", "image_size", "test_resize"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise NearsightError(f"model spec: {name} must be a whole number, got {value!r}")
        if self.dim == 0 or self.image_size == 0:
            raise NearsightError("model spec: dim and image_size must be positive")
        if self.test_resize == 0:
            object.__setattr__(self, "test_resize", default_resize(self.image_size))
        if self.pooling not in POOLINGS:
            raise NearsightError(f"model spec: unknown pooling {self.pooling!r}")
        if self.feature_norm not in RESOLVED_FEATURE_NORMS:
            raise NearsightError(f"model spec: unknown feature_norm {self.feature_norm!r}")
        if isinstance(self.heads, str) or not self.heads:
            raise NearsightError(f"model spec: heads must be a list of stages, got {self.heads!r}")
        object.__setattr__(self, "heads", tuple(str(head) for head in self.heads))
        if self.embedding not in EMBEDDINGS:
            raise NearsightError(f"model spec: unknown embedding {self.embedding!r}")
        if self.head not in HEAD_KINDS:
            raise NearsightError(f"model spec: unknown head {self.head!r}")
        if self.interpolation not in INTERPOLATIONS:
            raise NearsightError(f"model spec: unknown interpolation {self.interpolation!r}")
        self._check_normalisation()
        self._check_foreign()
        self.__dict__["_sealed"] = True

    def _check_normalisation(self) -> None:
        """``mean`` and ``std``: both empty (ImageNet's) or both 3 numbers, std positive."""
        if not self.mean and not self.std and not self.input_name:
            return
        for name in ("mean", "std"):
            value = getattr(self, name)
            try:
                numbers = tuple(float(x) for x in value)
            except (TypeError, ValueError):
                numbers = ()
            if len(numbers) != 3 or isinstance(value, str):
                raise NearsightError(
                    f"model spec: {name} must be 3 numbers (R, G, B), got {value!r}"
                )
            object.__setattr__(self, name, numbers)
        if min(self.std) <= 0:
            raise NearsightError(f"model spec: std must be positive, got {list(self.std)}")

    def _check_foreign(self) -> None:
        if not self.input_name:
            if self.output_name:
                raise NearsightError("model spec: output_name needs input_name")
            return
        if not self.output_name:
            raise NearsightError("model spec: a foreign model needs its output_name")

    @property
    def foreign(self) -> bool:
        """Whether this describes a model exported elsewhere (nearsight.models.foreign)."""
        return bool(self.input_name)

    @property
    def output_dim(self) -> int:
        """The width of the served embedding: ``dim``, or ``dim`` x heads for ``concat``."""
        return self.dim * len(self.heads) if self.embedding == "concat" else self.dim

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        values["heads"] = list(self.heads)
        values["mean"], values["std"] = list(self.mean), list(self.std)
        for name in OPTIONAL_FIELDS:  # the fields a ResNet's spec always had, and what is set
            if not values[name]:
                del values[name]
        for name, default in (("head", "linear"), ("interpolation", "bilinear")):
            if values[name] == default:
                del values[name]
        return values

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ModelSpec:
        """A spec from :meth:`to_dict`'s output; fields a newer nearsight added are refused."""
        if not isinstance(values, Mapping):
            raise NearsightError(f"model spec must be a mapping, got {type(values).__name__}")
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise NearsightError(f"model spec: unknown field(s) {', '.join(map(str, unknown))}")
        values = dict(values)
        for name in ("heads", "mean", "std"):
            if name in values and isinstance(values[name], list):
                values[name] = tuple(values[name])
        try:
            return cls(**values)
        except TypeError as error:
            raise NearsightError(f"model spec: {error}") from None

    @classmethod
    def from_json(cls, text: str) -> ModelSpec:
        try:
            values = json.loads(text)
        except json.JSONDecodeError as error:
            raise NearsightError(f"model spec is not JSON ({error.msg})") from None
        return cls.from_dict(values)


def spec_from_onnx_metadata(metadata: Mapping[str, str]) -> ModelSpec:
    """The spec of an exported model: its ``model_spec`` property, or (models exported before
    it existed) the separate ``embedding_dim``, ``image_size``, ``resize``, ``arch`` and
    ``pooling`` properties."""
    if SPEC_KEY in metadata:
        return ModelSpec.from_json(metadata[SPEC_KEY])
    try:
        image_size = int(metadata["image_size"])
        return ModelSpec(
            arch=metadata.get("arch") or ModelSpec.arch,
            dim=int(metadata["embedding_dim"]),
            image_size=image_size,
            test_resize=int(metadata.get("resize") or 0),
            pooling=metadata.get("pooling") or ModelSpec.pooling,
        )
    except (KeyError, ValueError) as error:
        raise NearsightError(f"no model spec in the metadata ({error!r})") from None


def spec_from_checkpoint(payload: Mapping[str, Any]) -> ModelSpec:
    """The spec of a loaded checkpoint: its ``model_spec``, or (checkpoints written before it
    existed) its ``model_config`` plus the training config's ``data.resize``."""
    if isinstance(payload.get(SPEC_KEY), Mapping):
        return ModelSpec.from_dict(payload[SPEC_KEY])
    model_config = payload.get("model_config") or {}
    training = payload.get("training") if isinstance(payload.get("training"), dict) else {}
    data_config = ((training.get("config") or {}).get("data") or {}) if training else {}
    return spec_from_model_config(model_config, data_config.get("resize"))


def network_values(values: Mapping[str, Any] | TrunkFields) -> dict[str, Any]:
    """The :data:`NETWORK_FIELDS` that ``values`` (a config, or its dict) sets; empty and
    missing ones are left to the spec's defaults."""
    get = values.get if isinstance(values, Mapping) else lambda name: getattr(values, name, None)
    found = {name: get(name) for name in NETWORK_FIELDS}
    return {name: value for name, value in found.items() if value not in (None, "", [], ())}


def spec_from_model_config(model_config: Mapping[str, Any], resize: int | None = None) -> ModelSpec:
    """A spec from an :class:`~nearsight.models.embedding.EmbeddingConfig` dict (its
    ``feature_norm`` resolved) and the test-time resize (None: the default ratio)."""
    values = network_values(model_config)
    if values.get("feature_norm") == "auto":  # never stored so; resolve as EmbeddingConfig does
        scratch = model_config.get("pretrained", "none") == "none"
        values["feature_norm"] = "batchnorm" if scratch else "none"
    values.setdefault("feature_norm", "none")
    for name in ("heads", "mean", "std"):
        if name in values:
            values[name] = tuple(values[name])
    return ModelSpec(test_resize=int(resize or 0), **values)


# The fields that describe the network itself; the rest say how a file is run (the test-time
# resize, a foreign model's input and output names). The training config's model section and
# the checkpoint's EmbeddingConfig inherit them (TrunkFields, NetworkFields).
SERVING_FIELDS = ("test_resize", "input_name", "output_name")
NETWORK_FIELDS = tuple(field.name for field in dataclasses.fields(NetworkFields))


def spec_from_gallery_meta(meta: Mapping[str, Any]) -> ModelSpec | None:
    """The spec a gallery recorded: ``model_spec``, or (galleries built before it existed) its
    ``dim``, ``image_size`` and ``resize`` (arch "": not recorded); None when it recorded
    neither."""
    if isinstance(meta.get(SPEC_KEY), Mapping):
        return ModelSpec.from_dict(meta[SPEC_KEY])
    if "image_size" in meta and "dim" in meta:
        return ModelSpec(
            arch="",
            dim=int(meta["dim"]),
            image_size=int(meta["image_size"]),
            test_resize=int(meta.get("resize") or 0),
        )
    return None
