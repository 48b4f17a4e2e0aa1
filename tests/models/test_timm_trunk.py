"""timm trunks (nearsight/models/timm_trunk.py): pooling by family, heads on stages, the
pretrained config in the spec, and one-line errors. Tiny random timm models (timm's own
``test_*`` models) at small sizes: no weights, no network."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import TIMM_CONVNEXT, TIMM_RESNET, TIMM_VIT

from nearsight.core.errors import NearsightError
from nearsight.models.checkpoint import load_checkpoint, load_embedding_net, save_checkpoint
from nearsight.models.embedding import EmbeddingConfig, EmbeddingNet, build_embedding_net
from nearsight.models.pooling import pool_map, pool_tokens
from nearsight.models.spec import ModelSpec, spec_from_checkpoint
from nearsight.models.timm_trunk import timm_info


def images(n: int = 3, size: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def normalised(net: EmbeddingNet, x: torch.Tensor) -> torch.Tensor:
    return (x - net.mean) / net.std


def timm_own_features(net: EmbeddingNet, x: torch.Tensor) -> torch.Tensor:
    """What the pretrained timm model itself outputs before its classifier."""
    trunk = net.trunk
    return trunk.forward_head(trunk.forward_features(normalised(net, x)), pre_logits=True)


def test_the_spec_carries_the_pretrained_config():
    config = EmbeddingConfig(arch=TIMM_VIT, dim=8, image_size=32, pooling="token")
    spec = config.spec()
    info = timm_info(TIMM_VIT)  # timm's test_vit: 160 px, mean/std 0.5, bicubic, crop 0.95
    assert (info.image_size, info.crop_pct, info.interpolation) == (160, 0.95, "bicubic")
    assert spec.mean == (0.5, 0.5, 0.5) and spec.std == (0.5, 0.5, 0.5)
    assert spec.interpolation == "bicubic"
    assert spec.test_resize == 33  # timm's floor(32 / 0.95)
    assert ModelSpec.from_json(spec.to_json()) == spec
    assert EmbeddingConfig.from_spec(spec).spec() == spec
    # the ResNets' specs read as they always did: no new keys
    assert set(EmbeddingConfig(arch="resnet18", image_size=32).spec().to_dict()) == {
        "arch", "dim", "image_size", "test_resize", "pooling", "feature_norm", "heads",
        "embedding",
    }  # fmt: skip


def test_the_network_normalises_with_the_trunks_own_statistics():
    net = EmbeddingNet(EmbeddingConfig(arch=TIMM_CONVNEXT, dim=8, image_size=32))
    assert net.mean.flatten().tolist() == [0.5, 0.5, 0.5]  # test_convnext's, not ImageNet's
    assert net.std.flatten().tolist() == [0.5, 0.5, 0.5]


@pytest.mark.parametrize(
    ("arch", "pooling"),
    [(TIMM_VIT, "token"), ("timm:test_vit2", "avg"), (TIMM_CONVNEXT, "avg"), (TIMM_RESNET, "avg")],
)
def test_the_default_pooling_serves_the_pretrained_models_own_features(arch, pooling):
    """head none: the embedding is the L2-normalised features of timm's own head (class token
    and final norm for a ViT; mean over patches and fc_norm for test_vit2; ConvNeXt's average
    pool then LayerNorm; a ResNet's average pool)."""
    torch.manual_seed(0)
    assert timm_info(arch).default_pooling == pooling
    net = EmbeddingNet(EmbeddingConfig(arch=arch, head="none", image_size=32)).eval()
    x = images()
    with torch.no_grad():
        expected = F.normalize(timm_own_features(net, x), dim=1)
        got = net(x)
    assert net.dim == timm_info(arch).width == got.shape[1]
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_transformer_pools_run_over_the_patch_tokens_only():
    tokens = torch.tensor([[[100.0, -5.0], [1.0, 2.0], [3.0, 4.0]]])  # class token, 2 patches
    assert pool_tokens(tokens, "token", 1).tolist() == [[100.0, -5.0]]
    assert pool_tokens(tokens, "avg", 1).tolist() == [[2.0, 3.0]]
    assert pool_tokens(tokens, "max", 1).tolist() == [[3.0, 4.0]]
    assert pool_tokens(tokens, "avgmax", 1).tolist() == [[5.0, 7.0]]
    gem = pool_tokens(tokens, "gem", 1)
    torch.testing.assert_close(gem, torch.tensor([[(28 / 2) ** (1 / 3), (72 / 2) ** (1 / 3)]]))


def test_gem_over_tokens_keeps_their_sign():
    """A transformer's tokens are signed: GeM over them is the signed generalised mean, not
    GeM of the tokens clipped at 0 (which flattened every negative feature to 1e-6)."""
    tokens = torch.tensor([[[9.0, 9.0, 9.0], [-1.0, 1.0, -1.0], [-2.0, -2.0, 1.0]]])
    gem = pool_tokens(tokens, "gem", 1)[0]
    # mean of x^3 per feature: -4.5, -3.5, 0; its signed cube root
    torch.testing.assert_close(gem, torch.tensor([-(4.5 ** (1 / 3)), -(3.5 ** (1 / 3)), 0.0]))
    positive = torch.rand(2, 5, 4) + 0.1  # on positive tokens: GeM itself
    expected = positive[:, 1:].pow(3).mean(dim=1).pow(1 / 3)
    torch.testing.assert_close(pool_tokens(positive, "gem", 1), expected)
    # finite gradients, a feature whose mean is exactly 0 included
    tokens = tokens.clone().requires_grad_(True)
    pool_tokens(tokens, "gem", 1).sum().backward()
    assert torch.isfinite(tokens.grad).all()
    assert tokens.grad[0, 0].abs().sum() == 0  # the class token is left out


def test_gem_is_the_generalised_mean_of_the_map():
    features = torch.tensor([1.0, 2.0, 3.0, 4.0]).view(1, 1, 2, 2)
    expected = ((1 + 8 + 27 + 64) / 4) ** (1 / 3)
    assert pool_map(features, "gem").item() == pytest.approx(expected, rel=1e-6)
    # negative features are clamped: GeM's root needs them >= 0
    assert pool_map(-features, "gem").item() == pytest.approx(1e-6, rel=1e-3)


@pytest.mark.parametrize("pooling", ["gem", "max", "avgmax"])
def test_other_poolings_of_a_cnn_go_through_its_own_head_too(pooling):
    torch.manual_seed(0)
    net = EmbeddingNet(
        EmbeddingConfig(arch=TIMM_CONVNEXT, head="none", pooling=pooling, image_size=64)
    )
    net.eval()
    x = images(size=64)
    with torch.no_grad():
        pooled = pool_map(net.trunk.forward_features(normalised(net, x)), pooling)
        expected = F.normalize(net.trunk.forward_head(pooled, pre_logits=True), dim=1)
        torch.testing.assert_close(net(x), expected, rtol=0, atol=1e-6)


def test_multi_level_heads_sit_on_timms_stages():
    torch.manual_seed(0)
    heads = ["stages.1", "stages.2", "stages.3"]
    config = EmbeddingConfig(
        arch=TIMM_CONVNEXT, dim=8, image_size=64, heads=heads, embedding="concat"
    )
    net = EmbeddingNet(config).eval()
    keys = net.state_dict().keys()
    assert {"side_embeddings.stages_1.weight", "side_embeddings.stages_2.weight"} <= set(keys)
    widths = dict(timm_info(TIMM_CONVNEXT).stages)
    assert net.side_embeddings["stages_1"].in_features == widths["stages.1"]
    with torch.no_grad():
        every = net(images(size=64), all_heads=True)
        served = net(images(size=64))
    assert [tuple(e.shape) for e in every] == [(3, 8)] * 3
    assert served.shape == (3, 24)
    torch.testing.assert_close(served.norm(dim=1), torch.ones(3))
    # each lower head reads its stage's raw output, average-pooled
    with torch.no_grad():
        _, stages = net.trunk.forward_intermediates(normalised(net, images(size=64)), indices=[1])
        pooled = stages[0].mean(dim=(2, 3))
        expected = F.normalize(net.side_embeddings["stages_1"](net.side_norms["stages_1"](pooled)))
    torch.testing.assert_close(every[0], expected, rtol=0, atol=1e-6)


def test_the_default_heads_mean_the_last_stage():
    assert EmbeddingConfig(arch=TIMM_VIT, image_size=32).heads == ["blocks.5"]
    assert EmbeddingConfig(arch=TIMM_CONVNEXT, image_size=32).heads == ["stages.3"]
    assert EmbeddingConfig(arch=TIMM_RESNET, image_size=32).heads == ["layer4"]


def test_a_checkpoint_of_a_timm_network_loads_back(tmp_path):
    torch.manual_seed(0)
    net = build_embedding_net(EmbeddingConfig(arch=TIMM_VIT, dim=8, image_size=32, pooling="gem"))
    path = save_checkpoint(tmp_path / "best.pt", net)
    spec = spec_from_checkpoint(load_checkpoint(path))
    assert spec == net.config.spec() and spec.interpolation == "bicubic"
    again = load_embedding_net(path)
    with torch.no_grad():
        torch.testing.assert_close(again(images()), net.eval()(images()), rtol=0, atol=0)


def test_frozen_batchnorm_and_the_parameter_split():
    net = EmbeddingNet(EmbeddingConfig(arch=TIMM_RESNET, dim=8, image_size=32, freeze_bn=True))
    net.train()
    norms = [m for m in net.trunk.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms and not any(m.training for m in norms)
    trunk = {id(p) for p in net.trunk_parameters()}
    head = {id(p) for p in net.head_parameters()}
    assert not trunk & head and trunk | head == {id(p) for p in net.parameters()}


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"arch": "timm:vit_smal_patch16_224"}, "did you mean timm:vit_small_patch16_224"),
        ({"arch": "timm:vit_small_patch16_224.nosuchtag"}, "has no such model"),
        ({"arch": TIMM_CONVNEXT, "pooling": "token"}, "does not fit timm:test_convnext"),
        ({"arch": TIMM_VIT, "heads": ["blocks.2", "blocks.5"]}, "one head"),
        ({"arch": TIMM_CONVNEXT, "heads": ["stages.9", "stages.3"]}, "no stage(s) stages.9"),
        ({"arch": TIMM_CONVNEXT, "heads": ["stages.3", "stages.1"]}, "low to high"),
        ({"arch": TIMM_VIT, "pretrained": "imagenet"}, "--pretrained hub"),
        ({"arch": "resnet18", "pretrained": "hub"}, "for timm:NAME trunks"),
        ({"arch": TIMM_CONVNEXT, "head": "none", "feature_norm": "batchnorm"}, "head none"),
    ],
)
def test_bad_settings_are_one_line_errors(values, fragment):
    with pytest.raises(NearsightError) as error:
        EmbeddingConfig(**{"image_size": 32, **values})
    assert fragment in str(error.value) and "\n" not in str(error.value)
