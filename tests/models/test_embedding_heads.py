"""Multi-level embedding heads (the RLL and ICE papers' L, M, H): one pooled linear head per
listed trunk stage, the served embedding the last head or the normalised concatenation."""

from __future__ import annotations

import pytest
import torch

from nearsight.core.errors import NearsightError
from nearsight.models.checkpoint import load_embedding_net, save_checkpoint
from nearsight.models.embedding import EmbeddingConfig, EmbeddingNet, output_dim

LMH = ["layer2", "layer3", "layer4"]


def make_net(embedding: str = "last", feature_norm: str = "none", heads=None) -> EmbeddingNet:
    torch.manual_seed(0)
    config = EmbeddingConfig(
        dim=8,
        arch="resnet18",
        image_size=32,
        heads=list(heads or LMH),
        embedding=embedding,
        feature_norm=feature_norm,
    )
    return EmbeddingNet(config).eval()


def test_each_head_pools_its_own_stage():
    net = make_net()
    assert list(net.side_embeddings) == ["layer2", "layer3"]
    # resnet18 widths: layer2 128, layer3 256, layer4 512
    assert net.side_embeddings["layer2"].weight.shape == (8, 128)
    assert net.side_embeddings["layer3"].weight.shape == (8, 256)
    assert net.embedding.weight.shape == (8, 512)
    images = torch.rand(3, 3, 32, 32)
    with torch.no_grad():
        heads = net(images, all_heads=True)
        served = net(images)
        # the layer2 head by hand: trunk up to layer2, average pool, linear, L2 norm
        x = (images - net.mean) / net.std
        for name, layer in net.trunk.named_children():
            x = layer(x)
            if name == "layer2":
                break
        by_hand = torch.nn.functional.normalize(
            net.side_embeddings["layer2"](x.mean(dim=(2, 3))), dim=1
        )
    assert len(heads) == 3 and all(h.shape == (3, 8) for h in heads)
    torch.testing.assert_close(heads[0], by_hand)
    for head in heads:
        torch.testing.assert_close(head.norm(dim=1), torch.ones(3))
    torch.testing.assert_close(served, heads[-1])  # embedding=last serves the high head
    assert net.dim == 8


def test_concat_serves_the_normalised_concatenation():
    net = make_net("concat")
    images = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        heads = net(images, all_heads=True)
        served = net(images)
    assert net.dim == 24 and served.shape == (2, 24)
    expected = torch.cat(heads, dim=1) / 3**0.5  # three unit vectors: norm sqrt(3)
    torch.testing.assert_close(served, expected)
    assert output_dim(net.config.to_dict()) == 24


def test_single_head_default_keeps_the_single_head_state_dict():
    net = EmbeddingNet(EmbeddingConfig(dim=8, arch="resnet18", image_size=32))
    keys = set(net.state_dict())
    assert not any(k.startswith("side_") for k in keys)
    assert {"embedding.weight", "embedding.bias"} <= keys
    assert net.config.heads == ["layer4"] and net.config.embedding == "last"


def test_head_parameters_cover_every_head():
    net = make_net()
    head = {id(p) for p in net.head_parameters()}
    trunk = {id(p) for p in net.trunk_parameters()}
    assert len(head) == 6 and not head & trunk
    assert head | trunk == {id(p) for p in net.parameters()}


def test_folding_every_heads_feature_norm_keeps_the_function():
    net = make_net("concat", feature_norm="batchnorm").train()
    with torch.no_grad():
        for _ in range(3):  # give the running statistics something to hold
            net(torch.rand(6, 3, 32, 32), all_heads=True)
    net.eval()
    images = torch.rand(4, 3, 32, 32)
    with torch.no_grad():
        before = net(images)
        net.fold_feature_norm()
        after = net(images)
    assert all(isinstance(m, torch.nn.Identity) for m in net.side_norms.values())
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-5)


def test_checkpoint_round_trip_keeps_heads_and_embedding(tmp_path):
    net = make_net("concat")
    save_checkpoint(tmp_path / "m.pt", net)
    loaded = load_embedding_net(tmp_path / "m.pt")
    assert loaded.config.heads == LMH and loaded.config.embedding == "concat"
    images = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(images), net(images))


@pytest.mark.parametrize(
    ("heads", "embedding", "message"),
    [
        (["layer5", "layer4"], "last", "unknown stage"),
        (["layer3", "layer2", "layer4"], "last", "low to high"),
        (["layer2", "layer3"], "last", "ending at layer4"),
        (["layer4", "layer4"], "last", "distinct"),
        ([], "last", "non-empty"),
        (LMH, "mean", "embedding must be"),
    ],
)
def test_bad_heads_are_clear_errors(heads, embedding, message):
    with pytest.raises(NearsightError, match=message):
        EmbeddingConfig(dim=8, heads=heads, embedding=embedding)
