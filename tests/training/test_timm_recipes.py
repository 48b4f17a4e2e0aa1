"""The ViT recipes in nearsight/training/configs: a DINO ViT-S/16 and a CLIP ViT-B/16 fine-tuned on
CUB, CARS and SOP with each seed loss and Proxy Anchor, following the sphere version of Ermolov
et al.'s Hyperbolic ViT recipe (CVPR 2022) with HIER's (CVPR 2023) warm-up. Checked here: the
settings each file shares, the loss settings it takes from the ResNet reproduction of the same
loss, the batch design the trainer builds, and the cited rows."""

from __future__ import annotations

from pathlib import Path

import pytest

import nearsight.training as training_package
from nearsight.training.builders import build_train_sampler, build_training_loss
from nearsight.training.config import load_config, parse_yaml
from nearsight.training.paper import read_paper

CONFIG_DIR = Path(training_package.__file__).parent / "configs"
BACKBONES = {
    "dino_vits16": ("timm:vit_small_patch16_224.dino", 384),
    "clip_vitb16": ("timm:vit_base_patch16_clip_224.openai", 512),
}
LOSSES = ("ice", "rll", "nra", "rankmi", "bcontrastive", "proxyanchor")
DATASETS = ("cub", "cars", "sop")
# the recipe's batches (classes x images), steps (its epochs x batches per epoch), test resize
RECIPE = {
    "cub": ((100, 9), 50, 256),
    "cars": ((98, 9), 300, 224),
    "sop": ((450, 2), 5000, 224),
}
# Ermolov et al.'s results table, row Sph-DINO, 384-d (the README's results.png): Recall@k at
# the dataset's four k
SPH_DINO = {
    "cub": [78.7, 86.7, 91.4, 94.9],
    "cars": [86.6, 91.8, 95.2, 97.4],
    "sop": [82.2, 92.1, 96.8, 98.9],
}
# HIER's warm-up (the trunk frozen), in epochs of the recipe's sampler: 5 on SOP, else 1
WARMUP_EPOCHS = {"cub": 1, "cars": 1, "sop": 5}
RECIPES = [(b, loss, d) for b in BACKBONES for loss in LOSSES for d in DATASETS]


def recipe_id(recipe: tuple[str, str, str]) -> str:
    return "_".join(recipe)


def labels(dataset: str) -> list[int]:
    """Labels with the dataset's class sizes: CUB ~59 a class, CARS ~82, SOP 2-12."""
    sizes = {"cub": [59] * 100, "cars": [82] * 98, "sop": [2 + i % 11 for i in range(1000)]}
    return [label for label, size in enumerate(sizes[dataset]) for _ in range(size)]


def test_one_recipe_per_backbone_loss_and_dataset():
    found = sorted(p.name for p in CONFIG_DIR.glob("*.yaml") if p.name.startswith(tuple(BACKBONES)))
    assert found == sorted(f"{recipe_id(r)}.yaml" for r in RECIPES)


@pytest.mark.parametrize("recipe", RECIPES, ids=recipe_id)
def test_recipe_settings(recipe):
    backbone, loss, dataset = recipe
    config = load_config(CONFIG_DIR / f"{recipe_id(recipe)}.yaml")
    arch, dim = BACKBONES[backbone]
    (classes, per_class), steps, resize = RECIPE[dataset]
    assert (config.model.arch, config.model.dim, config.model.pooling) == (arch, dim, "token")
    assert config.model.pretrained == "hub" and config.model.head == "linear"
    data = config.data
    assert (data.dataset, data.image_size, data.resize) == (dataset, 224, resize)
    assert config.data.crop_scale == [0.2, 1.0]
    assert (config.sampler.classes_per_batch, config.sampler.per_class) == (classes, per_class)
    assert config.steps == steps and config.eval_every <= steps
    optim = config.optim
    assert optim.name == "adamw" and optim.schedule == "constant"
    epochs = {"cub": 50, "cars": 300, "sop": 200}[dataset]
    assert optim.freeze_trunk_steps == WARMUP_EPOCHS[dataset] * steps // epochs
    assert optim.lr <= optim.head_lr  # the pretrained trunk never faster than the new layers
    assert (optim.head_lr > optim.lr) == (dataset == "sop")  # HIER's head rate on SOP only
    assert config.loss.name == loss
    # the loss's own settings: those of its ResNet reproduction on the same dataset
    assert config.loss.params == load_config(CONFIG_DIR / f"{loss}_{dataset}.yaml").loss.params
    if loss == "proxyanchor":
        assert optim.loss_lr == pytest.approx(100 * optim.lr)


@pytest.mark.parametrize("recipe", RECIPES, ids=recipe_id)
def test_the_trainer_builds_the_batch_design_and_the_loss(recipe):
    config = load_config(CONFIG_DIR / f"{recipe_id(recipe)}.yaml")
    sampler = build_train_sampler(config, labels(recipe[2]))
    assert sampler.batch_size == config.sampler.classes_per_batch * config.sampler.per_class
    build_training_loss(config, sampler)


@pytest.mark.parametrize("recipe", RECIPES, ids=recipe_id)
def test_the_cited_rows(recipe):
    backbone, _, dataset = recipe
    paper = read_paper(CONFIG_DIR / f"{recipe_id(recipe)}.yaml")
    assert "Hyperbolic Vision" in paper.cite and "github.com/htdt/hyp_metric" in paper.cite
    if backbone == "dino_vits16":
        assert paper.row.startswith("Sph-DINO, 384")
        recalls = [value for key, value in paper.metrics.items() if key.startswith("recall@")]
        assert recalls == SPH_DINO[dataset]
    else:  # nothing published for CLIP with this recipe: every cell empty, with its reason
        assert all(value is None for value in paper.metrics.values())
        assert set(paper.missing) == set(paper.metrics)
    assert any("loss" in line for line in paper.differs)


@pytest.mark.parametrize("recipe", RECIPES, ids=recipe_id)
def test_what_the_recipe_does_not_take_from_the_papers_is_listed(recipe):
    """Each choice that is neither the recipe's nor the loss paper's is in paper.differs (the
    reproduction table prints it), not only in a YAML comment."""
    backbone, loss, dataset = recipe
    config = load_config(CONFIG_DIR / f"{recipe_id(recipe)}.yaml")
    differs = " ".join(read_paper(CONFIG_DIR / f"{recipe_id(recipe)}.yaml").differs)
    sampler = config.sampler
    # the loss's paper contributes its parameters, not its batches (nor RLL's and ICE's heads)
    assert f"the recipe's batches, {sampler.classes_per_batch} classes x {sampler.per_class}" in (
        differs
    )
    assert ("where the paper trains three" in differs) == (loss in ("rll", "ice"))
    if dataset == "sop":  # HIER's head rate and warm-up, not the recipe's
        assert "100 times the trunk's rate" in differs and "--warmup_epochs 5" in differs
    if backbone == "clip_vitb16":  # the 512-d layer is new: CLIP's projection is dropped
        assert "768->512 image projection" in differs
    assert "CPUs with AVX512-BF16 or AMX" in differs and "apex O2 (fp16)" in differs


def test_the_sop_rows_have_the_sop_protocol():
    values = parse_yaml((CONFIG_DIR / "dino_vits16_ice_sop.yaml").read_text())
    assert values["ks"] == [1, 10, 100, 1000]
    assert list(values["paper"]["metrics"]) == [
        "recall@1", "recall@10", "recall@100", "recall@1000", "map@r",
    ]  # fmt: skip
