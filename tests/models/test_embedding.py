"""EmbeddingNet, its config, and pretrained-weight resolution (nearsight/models/embedding.py, weights.py).

ResNet-50 on a 2-core CPU is slow: nets are built once per module and fed 32-64 px images.
"""

from __future__ import annotations

import time

import pytest
import torch
import torchvision
from torch import nn

from nearsight.core.errors import NearsightError
from nearsight.models.embedding import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    EmbeddingConfig,
    EmbeddingNet,
    build_embedding_net,
)
from nearsight.models.weights import imagenet_cache_path


@pytest.fixture(scope="module")
def net() -> EmbeddingNet:
    torch.manual_seed(0)
    return EmbeddingNet(EmbeddingConfig(dim=16))


@pytest.fixture(scope="module")
def random_resnet50_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    return torchvision.models.resnet50(weights=None).state_dict()


# ---------------------------------------------------------------- config


def test_config_round_trips_through_dict():
    config = EmbeddingConfig(dim=64, pooling="avgmax", pretrained="imagenet-v2", freeze_bn=True)
    values = config.to_dict()
    assert values == {
        "dim": 64,
        "pooling": "avgmax",
        "pretrained": "imagenet-v2",
        "freeze_bn": True,
        "image_size": 224,
        "arch": "resnet50",
        "feature_norm": "none",  # "auto" is stored resolved
        "heads": ["layer4"],
        "embedding": "last",
        "head": "linear",
        "interpolation": "bilinear",  # resolved: a ResNet's
        "mean": [],  # ImageNet's, inside the network
        "std": [],
    }
    assert EmbeddingConfig.from_dict(values) == config
    # a checkpoint from before multi-level heads has neither key: one layer4 head
    old = {k: v for k, v in values.items() if k not in ("heads", "embedding")}
    assert EmbeddingConfig.from_dict(old) == config


def test_config_from_dict_rejects_unknown_keys():
    with pytest.raises(NearsightError, match="unknown embedding setting.*dimension"):
        EmbeddingConfig.from_dict({"dimension": 128})


@pytest.mark.parametrize(
    "values",
    [
        {"dim": 0},
        {"dim": -3},
        {"dim": 1.5},
        {"pooling": "median"},
        {"pooling": "token"},  # a transformer's class token: a ResNet has none
        {"image_size": 8},
        {"arch": "vgg16"},
        {"feature_norm": "layernorm"},
    ],
)
def test_config_rejects_bad_values(values):
    with pytest.raises(NearsightError):
        EmbeddingConfig(**values)


# ---------------------------------------------------------------- forward


def test_output_shape_and_unit_norm(net):
    net.eval()
    with torch.no_grad():
        out = net(torch.rand(3, 3, 64, 64))
    assert out.shape == (3, 16)
    torch.testing.assert_close(out.norm(dim=1), torch.ones(3))


def test_normalisation_is_inside_the_model(net):
    """A [0,1] image goes through (x - mean) / std before the trunk: feeding the trunk the
    normalised image by hand gives the same embedding."""
    net.eval()
    images = torch.rand(2, 3, 32, 32)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    with torch.no_grad():
        features = net.trunk((images - mean) / std).mean(dim=(2, 3))
        by_hand = torch.nn.functional.normalize(net.embedding(features), dim=1)
        torch.testing.assert_close(net(images), by_hand)
    # constants, not weights: checkpoints do not carry them
    assert not any(key in net.state_dict() for key in ("mean", "std"))


@pytest.mark.parametrize("pooling", ["avg", "max", "avgmax"])
def test_pooling_variants(net, pooling):
    net.eval()
    images = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        features = net.trunk((images - net.mean) / net.std)  # [2, 2048, 2, 2]
        expected = {
            "avg": features.mean(dim=(2, 3)),
            "max": features.amax(dim=(2, 3)),
            "avgmax": features.mean(dim=(2, 3)) + features.amax(dim=(2, 3)),
        }[pooling]
        expected = torch.nn.functional.normalize(net.embedding(expected), dim=1)
        net.pooling = pooling
        try:
            out = net(images)
        finally:
            net.pooling = "avg"
    torch.testing.assert_close(out, expected)


def test_channels_last_gives_the_same_embeddings(net):
    net.eval()
    images = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        reference = net(images)
        net.to(memory_format=torch.channels_last)
        try:
            out = net(images.to(memory_format=torch.channels_last))
        finally:
            net.to(memory_format=torch.contiguous_format)
    torch.testing.assert_close(out, reference, atol=1e-5, rtol=1e-4)


def test_head_init_is_kaiming_fan_out_with_zero_bias(net):
    weight = net.embedding.weight
    assert weight.shape == (16, 2048)
    assert torch.count_nonzero(net.embedding.bias) == 0
    # kaiming_normal_(mode="fan_out"): std = sqrt(2 / fan_out) = sqrt(2 / 16)
    assert abs(weight.std().item() - (2 / 16) ** 0.5) < 0.02


def test_trunk_and_head_parameters_cover_every_parameter_once(net):
    trunk = list(net.trunk_parameters())
    head = list(net.head_parameters())
    ids = [id(p) for p in trunk + head]
    assert len(ids) == len(set(ids))
    assert set(ids) == {id(p) for p in net.parameters()}
    assert {id(p) for p in head} == {id(net.embedding.weight), id(net.embedding.bias)}
    assert sum(p.numel() for p in trunk) == 23_508_032  # ResNet-50 without fc


def test_freeze_bn_keeps_running_stats_and_trains_affine():
    torch.manual_seed(0)
    frozen = EmbeddingNet(EmbeddingConfig(dim=8, freeze_bn=True))
    with torch.no_grad():  # as after loading pretrained weights: no zero-initialised branch
        for block in frozen.trunk.modules():
            if isinstance(block, torchvision.models.resnet.Bottleneck):
                block.bn3.weight.fill_(1.0)
    frozen.train()
    batch_norms = [m for m in frozen.trunk.modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(batch_norms) == 53
    assert frozen.training and not any(m.training for m in batch_norms)
    # the trunk's statistics; the head's feature_norm (from scratch) is new and keeps learning
    before = {
        k: v.clone()
        for k, v in frozen.state_dict().items()
        if k.startswith("trunk.") and "running" in k
    }
    frozen(torch.rand(2, 3, 32, 32)).pow(2).sum().backward()  # batch of 2: fine in eval BN
    after = frozen.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(m.weight.grad is not None and m.weight.grad.abs().sum() > 0 for m in batch_norms)
    assert all(m.bias.grad is not None for m in batch_norms)
    frozen.eval()
    frozen.train()  # going back to train mode re-freezes
    assert not any(m.training for m in batch_norms)


def test_feature_norm_auto_is_batchnorm_exactly_from_scratch():
    assert EmbeddingConfig().feature_norm == "batchnorm"
    assert EmbeddingConfig(pretrained="imagenet").feature_norm == "none"
    assert EmbeddingConfig(pretrained="weights.pth").feature_norm == "none"
    assert EmbeddingConfig(pretrained="imagenet", feature_norm="batchnorm").feature_norm == (
        "batchnorm"
    )
    assert EmbeddingConfig(feature_norm="none").feature_norm == "none"
    standardised = EmbeddingNet(EmbeddingConfig(dim=8))
    assert {"feature_norm.running_mean", "feature_norm.running_var"} <= set(
        standardised.state_dict()
    )
    plain = EmbeddingNet(EmbeddingConfig(dim=8, feature_norm="none"))
    assert not any(key.startswith("feature_norm") for key in plain.state_dict())


def test_untrained_residual_branches_start_at_zero(net):
    blocks = [m for m in net.trunk.modules() if isinstance(m, torchvision.models.resnet.Bottleneck)]
    assert len(blocks) == 16
    assert all(torch.count_nonzero(block.bn3.weight) == 0 for block in blocks)


def _mean_pairwise_cosine(embeddings: torch.Tensor) -> float:
    n = embeddings.shape[0]
    similarities = embeddings @ embeddings.T
    return float((similarities.sum() - similarities.diagonal().sum()) / (n * (n - 1)))


def test_feature_norm_spreads_the_embeddings_of_an_untrained_net():
    """The reason for batchnorm from scratch: without it, embeddings of unrelated images of an
    untrained ResNet-50 point almost the same way."""
    images = torch.rand(16, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    cosines = {}
    for feature_norm in ("none", "batchnorm"):
        torch.manual_seed(0)
        model = EmbeddingNet(EmbeddingConfig(dim=32, feature_norm=feature_norm)).train()
        with torch.no_grad():
            cosines[feature_norm] = _mean_pairwise_cosine(model(images))
    assert cosines["none"] > 0.4  # measured 0.61 (0.99 without zero_init_residual)
    assert abs(cosines["batchnorm"]) < 0.15  # measured -0.07


def test_folding_feature_norm_into_the_head_keeps_the_function():
    torch.manual_seed(0)
    model = EmbeddingNet(EmbeddingConfig(dim=16, arch="resnet18")).eval()
    with torch.no_grad():  # statistics unlike a fresh build's 0 and 1
        model.feature_norm.running_mean.uniform_(-1.0, 1.0)
        model.feature_norm.running_var.uniform_(0.1, 3.0)
    images = torch.rand(4, 3, 32, 32)
    with torch.no_grad():
        before = model(images)
        model.fold_feature_norm()
        after = model(images)
    assert isinstance(model.feature_norm, nn.Identity)
    torch.testing.assert_close(after, before, atol=1e-5, rtol=0)


def test_without_freeze_bn_train_mode_updates_running_stats(net):
    net.train()
    try:
        bn = net.trunk.bn1
        assert bn.training
        before = bn.running_mean.clone()
        with torch.no_grad():
            net(torch.rand(2, 3, 32, 32))
        assert not torch.equal(before, bn.running_mean)
    finally:
        net.eval()


# ---------------------------------------------------------------- pretrained weights


@pytest.mark.parametrize("name", ["imagenet", "imagenet-v2"])
def test_imagenet_without_cache_or_network_fails_fast(empty_hub, no_network, name):
    start = time.monotonic()
    with pytest.raises(NearsightError) as caught:
        build_embedding_net(EmbeddingConfig(pretrained=name))
    assert time.monotonic() - start < 5
    message = str(caught.value)
    assert "\n" not in message
    assert "--pretrained none" in message and "FILE.pth" in message
    version = "IMAGENET1K_V2" if name == "imagenet-v2" else "IMAGENET1K_V1"
    assert f"ImageNet weights for resnet50 ({version}) are not cached at {empty_hub}" in message


def test_imagenet_cache_path_is_where_torchvision_puts_it(empty_hub):
    assert imagenet_cache_path("resnet50", "imagenet") == (
        empty_hub / "checkpoints" / "resnet50-0676ba61.pth"
    )
    assert imagenet_cache_path("resnet50", "imagenet-v2").name == "resnet50-11ad3fa6.pth"


def test_cached_imagenet_weights_are_used(empty_hub, no_network, random_resnet50_state):
    cached = imagenet_cache_path("resnet50", "imagenet")
    cached.parent.mkdir(parents=True)
    # like the old torchvision files: no num_batches_tracked counters
    torch.save({k: v for k, v in random_resnet50_state.items() if "num_batches" not in k}, cached)
    net = build_embedding_net(EmbeddingConfig(pretrained="imagenet", dim=8))
    _assert_trunk_equals(net, random_resnet50_state)


def test_local_pth_loads_identical_trunk_weights(tmp_path, random_resnet50_state):
    path = tmp_path / "r50.pth"
    torch.save(random_resnet50_state, path)
    net = build_embedding_net(EmbeddingConfig(pretrained=str(path), dim=8))
    _assert_trunk_equals(net, random_resnet50_state)


def test_local_pth_wrapped_and_with_module_prefix(tmp_path, random_resnet50_state):
    path = tmp_path / "ddp.pth"
    wrapped = {f"module.{k}": v for k, v in random_resnet50_state.items()}
    torch.save({"state_dict": wrapped, "epoch": 3}, path)
    net = build_embedding_net(EmbeddingConfig(pretrained=str(path), dim=8))
    _assert_trunk_equals(net, random_resnet50_state)


def test_missing_weights_file_is_one_line_error(tmp_path):
    with pytest.raises(NearsightError, match=r"nope\.pth: neither imagenet.*none nor an existing"):
        build_embedding_net(EmbeddingConfig(pretrained=str(tmp_path / "nope.pth")))


def test_mismatched_weights_are_one_line_errors(tmp_path, random_resnet50_state):
    partial = tmp_path / "partial.pth"
    torch.save({k: v for k, v in random_resnet50_state.items() if "layer4" not in k}, partial)
    with pytest.raises(NearsightError, match=r"keys do not match the trunk: \d+ missing"):
        build_embedding_net(EmbeddingConfig(pretrained=str(partial), dim=8))

    resnet18 = tmp_path / "r18.pth"
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), resnet18)
    with pytest.raises(NearsightError, match="r18.pth"):
        build_embedding_net(EmbeddingConfig(pretrained=str(resnet18), dim=8))

    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"not a torch file at all")
    with pytest.raises(NearsightError, match="garbage.pth: cannot read weights file"):
        build_embedding_net(EmbeddingConfig(pretrained=str(garbage), dim=8))


def _assert_trunk_equals(net: EmbeddingNet, reference: dict[str, torch.Tensor]) -> None:
    trunk_state = net.trunk.state_dict()
    for key, value in trunk_state.items():
        if key.endswith("num_batches_tracked"):
            continue
        assert torch.equal(value, reference[key]), key
    assert set(trunk_state) == {k for k in reference if not k.startswith("fc.")}
