"""One model spec (nearsight/models/spec.py): written into the checkpoint, carried into the ONNX metadata
and the gallery meta, read back by the embedders and the page; old files without it load."""

from __future__ import annotations

import json

import onnx
import pytest
import torch

from nearsight.core.errors import NearsightError
from nearsight.index.gallery.core import Gallery
from nearsight.models.checkpoint import load_checkpoint, save_checkpoint
from nearsight.models.embedder import OnnxEmbedder
from nearsight.models.embedding import EmbeddingConfig, build_embedding_net
from nearsight.models.loading import load_embedder
from nearsight.models.spec import (
    ModelSpec,
    default_resize,
    spec_from_checkpoint,
    spec_from_gallery_meta,
    spec_from_onnx_metadata,
)


def test_round_trip_and_defaults():
    spec = ModelSpec(arch="resnet18", dim=8, image_size=32, pooling="avgmax")
    assert spec.test_resize == default_resize(32) == 37
    assert ModelSpec.from_json(spec.to_json()) == spec
    assert ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert spec.heads == ("layer4",) and spec.embedding == "last"


@pytest.mark.parametrize(
    "values",
    [
        {"dim": 0},
        {"dim": "8"},
        {"pooling": "median"},
        {"feature_norm": "auto"},  # stored resolved
        {"heads": "layer4"},
        {"colour": "red"},  # a field this nearsight does not know
    ],
)
def test_bad_specs_are_one_line_errors(values):
    with pytest.raises(NearsightError, match="model spec"):
        ModelSpec.from_dict({**ModelSpec().to_dict(), **values})


def test_the_config_and_the_spec_agree():
    config = EmbeddingConfig(dim=8, image_size=32, arch="resnet18", pooling="max")
    spec = config.spec(test_resize=40)
    assert (spec.dim, spec.image_size, spec.test_resize, spec.arch, spec.pooling) == (
        8, 32, 40, "resnet18", "max",
    )  # fmt: skip
    assert spec.feature_norm == config.feature_norm == "batchnorm"  # from scratch
    again = EmbeddingConfig.from_spec(spec)
    assert again.spec(test_resize=40) == spec


def test_checkpoint_carries_the_spec_with_the_training_resize(tmp_path):
    net = build_embedding_net(EmbeddingConfig(dim=8, image_size=32, arch="resnet18"))
    path = tmp_path / "best.pt"
    extra = {"training": {"config": {"data": {"image_size": 32, "resize": 40}}}}
    save_checkpoint(path, net, extra=extra)
    payload = load_checkpoint(path)
    assert payload["model_spec"]["test_resize"] == 40
    assert spec_from_checkpoint(payload) == net.config.spec(test_resize=40)


def test_a_checkpoint_from_before_the_spec_still_loads(tmp_path):
    """Written as save_checkpoint wrote them before: no model_spec key."""
    net = build_embedding_net(EmbeddingConfig(dim=8, image_size=32, arch="resnet18"))
    path = tmp_path / "old.pt"
    torch.save(
        {
            "format": "nearsight-checkpoint",
            "version": 1,
            "model_config": net.config.to_dict(),
            "state_dict": net.state_dict(),
            "training": {"config": {"data": {"resize": 36}}},
        },
        path,
    )
    embedder = load_embedder(path, device="cpu")
    assert embedder.spec == net.config.spec(test_resize=36)
    assert embedder.resize == 36


def test_onnx_gallery_and_page_read_one_spec(onnx_gallery):
    embedder = OnnxEmbedder(onnx_gallery.model)
    expected = ModelSpec(arch="resnet18", dim=8, image_size=32, feature_norm="batchnorm")
    assert embedder.spec == expected
    with Gallery.open(onnx_gallery.gallery) as gallery:
        assert spec_from_gallery_meta(gallery.meta) == expected

    from nearsight.app.page.tables import spec_line

    assert spec_line(expected) == (
        "resnet18, dim 8 (the layer4 head), input: short side resized to 37 px, centre crop "
        "32 x 32, avg pooling"
    )


def test_an_onnx_model_from_before_the_spec_still_loads(onnx_gallery, tmp_path):
    """The metadata as export wrote it before: separate embedding_dim, image_size, resize,
    arch and pooling properties."""
    model = onnx.load(str(onnx_gallery.model))
    props = {p.key: p.value for p in model.metadata_props}
    spec = json.loads(props.pop("model_spec"))
    props.update(
        embedding_dim=str(spec["dim"]),
        image_size=str(spec["image_size"]),
        resize="40",
        arch=spec["arch"],
        pooling=spec["pooling"],
    )
    del model.metadata_props[:]
    for key, value in props.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    old = tmp_path / "old.onnx"
    onnx.save(model, str(old))
    embedder = OnnxEmbedder(old)
    assert (embedder.dim, embedder.image_size, embedder.resize) == (8, 32, 40)
    assert embedder.spec.arch == "resnet18"
    assert spec_from_onnx_metadata(props) == embedder.spec


def test_a_gallery_meta_from_before_the_spec():
    spec = spec_from_gallery_meta({"dim": 16, "image_size": 32, "resize": 40, "model": "m"})
    assert (spec.dim, spec.image_size, spec.test_resize, spec.arch) == (16, 32, 40, "")
    assert spec_from_gallery_meta({"dim": 16}) is None  # built from raw vectors


def test_a_concat_model_serves_dim_times_heads(tmp_path):
    from nearsight.models.export import export

    config = EmbeddingConfig(
        dim=8, image_size=32, arch="resnet18", heads=["layer3", "layer4"], embedding="concat"
    )
    spec = config.spec()
    assert (spec.dim, spec.heads, spec.output_dim) == (8, ("layer3", "layer4"), 16)
    save_checkpoint(tmp_path / "best.pt", build_embedding_net(config))
    export(tmp_path, tmp_path / "model.onnx")
    embedder = OnnxEmbedder(tmp_path / "model.onnx")
    assert embedder.spec == spec and embedder.dim == 16
    assert EmbeddingConfig.from_spec(spec).spec() == spec


def test_the_network_fields_are_spelled_out_once_in_the_spec():
    """ModelSpec names the network's fields; the checkpoint's EmbeddingConfig holds exactly
    those plus how training starts, and the training config's model section a subset (the
    size lives in data.image_size; interpolation and statistics come from the trunk)."""
    import dataclasses

    from nearsight.models.embedding_config import EmbeddingConfig
    from nearsight.models.spec import NETWORK_FIELDS
    from nearsight.training.config import ModelConfig

    training = {"pretrained", "freeze_bn"}
    names = {field.name for field in dataclasses.fields(EmbeddingConfig)}
    assert names == set(NETWORK_FIELDS) | training
    section = {field.name for field in dataclasses.fields(ModelConfig)}
    assert section - training <= set(NETWORK_FIELDS)
    assert set(NETWORK_FIELDS) - section == {"image_size", "interpolation", "mean", "std"}


def test_the_configs_inherit_the_spec_fields_names_types_and_defaults():
    """The training config's model section and the checkpoint's EmbeddingConfig inherit the
    spec's network fields (plain dataclass inheritance, which a type checker sees), so a field
    added there reaches both; a tuple of the spec is a list in a config, a fresh one each
    time, and a config's default is the spec's unless it leaves it to the trunk ("auto")."""
    import dataclasses
    import typing

    from nearsight.models.embedding_config import EmbeddingConfig
    from nearsight.models.spec import NETWORK_FIELDS, NetworkFields, TrunkFields
    from nearsight.training.config import ModelConfig

    assert issubclass(ModelSpec, NetworkFields) and issubclass(EmbeddingConfig, NetworkFields)
    assert issubclass(ModelConfig, TrunkFields) and not issubclass(ModelConfig, NetworkFields)
    spec_hints = typing.get_type_hints(ModelSpec)
    for config in (EmbeddingConfig, ModelConfig):
        made, again = config(), config()
        assert made.heads == list(ModelSpec.heads) and made.heads is not again.heads
        assert (made.arch, made.dim, made.embedding) == (ModelSpec.arch, ModelSpec.dim, "last")
        assert made.pooling == "auto" or config is EmbeddingConfig  # resolved at its init
        config_hints = typing.get_type_hints(config)
        for name in set(NETWORK_FIELDS) & set(config_hints):
            want = spec_hints[name]
            if typing.get_origin(want) is tuple:
                want = list[typing.get_args(want)[0]]
            assert config_hints[name] == want, (config.__name__, name)
    spec = ModelSpec()
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.dim = 64  # type: ignore[misc]
    assert hash(spec) == hash(ModelSpec()) and {spec: 1}[ModelSpec()] == 1


def test_a_spec_round_trips_through_the_checkpoint_config():
    from nearsight.models.embedding_config import EmbeddingConfig
    from nearsight.models.spec import spec_from_model_config

    spec = ModelSpec(arch="resnet18", dim=32, image_size=64, pooling="gem",
                     feature_norm="batchnorm", heads=("layer3", "layer4"), embedding="concat")  # fmt: skip
    config = EmbeddingConfig.from_spec(spec, pretrained="none")
    assert spec_from_model_config(config.to_dict(), spec.test_resize) == spec
