"""Why two items match (nearsight/models/similarity_map.py, nearsight/search/inspect/explain.py):
the similarity decomposed over the feature map's locations sums back to the pair's similarity
within 1e-4; models without such a map say so in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import FAST

from nearsight.app.cli import main
from nearsight.core.errors import NearsightError
from nearsight.data.datasets.synthetic import write_synthetic
from nearsight.index.gallery.core import Gallery
from nearsight.search.inspect.explain import draw, explain_pair

torch = pytest.importorskip("torch")


def checkpoint(path: Path, seed: int, **config) -> Path:
    from nearsight.models.checkpoint import save_checkpoint
    from nearsight.models.embedding import EmbeddingConfig, build_embedding_net

    torch.manual_seed(seed)
    settings = dict(dim=16, image_size=64, arch="resnet18", pretrained="none") | config
    return save_checkpoint(path, build_embedding_net(EmbeddingConfig(**settings)))


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("explain-data")
    write_synthetic(data, classes=3, per_class=3, size=96, seed=6)
    return data


def build(model: Path, data: Path, out: Path) -> Path:
    argv = ["index", "build", "--model", model, "--dataset", "folder", "--root", data,
            "--split", "all", "--out", out, *FAST]  # fmt: skip
    assert main([str(arg) for arg in argv]) == 0
    return out


@pytest.mark.parametrize(
    "config",
    [{}, {"feature_norm": "none"}, {"heads": ["layer3", "layer4"], "image_size": 96}],
    ids=["batchnorm-head", "plain-head", "two-heads-last"],
)
def test_the_map_sums_to_the_pair_s_similarity(images, tmp_path, config):
    model = checkpoint(tmp_path / "model.pt", seed=3, **config)
    gallery = build(model, images, tmp_path / "gallery")
    with Gallery.open(gallery) as opened:
        stored = np.asarray(opened.embeddings, dtype=np.float64)
        ids = list(opened.ids)
    for a, b in [(ids[0], ids[1]), (ids[0], ids[5]), (ids[2], ids[2])]:
        explanation = explain_pair(gallery, a, b)
        maps = explanation.maps
        assert maps.map_a.sum() == pytest.approx(maps.similarity, abs=1e-4)
        assert maps.map_b.sum() == pytest.approx(maps.similarity, abs=1e-4)
        # the similarity is the one the gallery's stored vectors give (to bf16's rounding:
        # a checkpoint embeds under bf16 autocast on a CPU with native bf16, the map in fp32)
        assert maps.similarity == pytest.approx(stored[a] @ stored[b], abs=1e-2)
        assert maps.map_a.ndim == 2 and maps.map_a.size > 1
        assert not np.allclose(maps.map_a, maps.map_a.mean())  # locations differ
    out = tmp_path / "why.png"
    draw(explanation, out)
    from PIL import Image

    with Image.open(out) as drawn:
        assert drawn.format == "PNG" and drawn.width > drawn.height


def test_an_onnx_gallery_finds_its_checkpoint_beside_the_model(onnx_gallery):
    explanation = explain_pair(onnx_gallery.gallery, 0, 1)
    with Gallery.open(onnx_gallery.gallery) as opened:
        stored = opened.vectors_of([0, 1])
    assert explanation.similarity == pytest.approx(float(stored[0] @ stored[1]), abs=1e-4)
    assert explanation.maps.map_a.sum() == pytest.approx(explanation.similarity, abs=1e-4)


def test_a_model_without_average_pooling_has_no_map(images, tmp_path):
    model = checkpoint(tmp_path / "gem.pt", seed=0, pooling="gem")
    gallery = build(model, images, tmp_path / "gem")
    with pytest.raises(NearsightError, match="no similarity map: .*gem"):
        explain_pair(gallery, 0, 1)
