"""Every config's ``paper:`` block: the row a reproduction is compared against, cited."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from nearsight.core.errors import NearsightError
from nearsight.training.config import load_config, shipped_configs
from nearsight.training.paper import problems, protocol_metrics, read_paper

CONFIG_DIR = Path(__file__).resolve().parents[2] / "nearsight" / "training" / "configs"


@pytest.mark.parametrize("name", shipped_configs())
def test_every_config_has_a_cited_paper_row(name):
    paper = read_paper(name)  # refuses a block that breaks a rule
    dataset = load_config(name).data.dataset
    assert set(protocol_metrics(dataset)) <= set(paper.metrics)
    numbers = {key: value for key, value in paper.metrics.items() if value is not None}
    # a row without a single number only where nothing is published (a recipe on a backbone
    # its paper did not train: the CLIP ViT recipes), every cell saying so
    assert numbers or name.startswith("clip_vitb16_"), "a paper row without a single number"
    for key in numbers:
        assert paper.citation(key)
    for key, value in paper.metrics.items():
        assert (value is None) == (key in paper.missing)
    assert paper.differs, "every config differs from its paper somewhere"
    assert paper.cite.count('"') == 2  # the title, quoted


def test_the_rows_are_the_papers_own_numbers():
    rankmi = read_paper("rankmi_cub")
    assert (rankmi.table, rankmi.row) == ("Table 1 (CUB-200-2011)", "RankMI (Ours) 128R")
    assert [rankmi.metrics[f"recall@{k}"] for k in (1, 2, 4, 8)] == [66.7, 77.2, 85.1, 91.0]
    assert rankmi.metrics["nmi"] == 71.3 and rankmi.nmi == "arithmetic"
    bcontrastive = read_paper("bcontrastive_cars")
    assert bcontrastive.metrics["recall@1"] == 69.18 and bcontrastive.metrics["nmi"] == 62.89
    # NMI as each paper defines it: the balanced contrastive paper's geometric mean
    assert {read_paper(f"bcontrastive_{d}").nmi for d in ("cub", "cars", "sop")} == {"geometric"}
    ice = read_paper("ice_cub")
    assert ice.metrics["recall@1"] is None and "lost" in ice.missing["recall@1"]
    assert "sec. 4.2" in read_paper("ice_sop").citation("recall@1")
    assert read_paper("rll_cub").metrics["nmi"] == 63.6


def test_each_row_says_which_network_its_paper_reports():
    """Only Proxy Anchor's code keeps its best test evaluation; RLL, ICE and the balanced
    contrastive paper train for a fixed length; RankMI and the NRA slides do not say."""
    expected = {"proxyanchor": "best", "rll": "final", "ice": "final", "bcontrastive": "final",
                "rankmi": "unstated", "nra": "unstated"}  # fmt: skip
    vit_recipes = ("dino_vits16_", "clip_vitb16_")  # the recipe evaluates once, at its end
    for name in shipped_configs():
        paper = read_paper(name)
        wanted = "final" if name.startswith(vit_recipes) else expected[name.split("_")[0]]
        assert paper.selection == wanted, name
    assert "2,000 iterations" in read_paper("bcontrastive_cub").selection_source
    assert "converges at 10k iterations" in read_paper("rll_cars").selection_source
    assert "after every epoch" in read_paper("proxyanchor_sop").selection_source


@pytest.mark.parametrize("name", shipped_configs())
def test_the_differences_a_researcher_found_are_listed(name):
    """Each choice the paper does not make (or makes otherwise) is in paper.differs, so the
    reproduction table shows it, not only a YAML comment."""
    paper, config = read_paper(name), load_config(name)
    differs = " ".join(paper.differs)
    loss = name.split("_")[0]
    if config.model.freeze_bn and loss != "proxyanchor":  # Proxy Anchor's own --bn-freeze 1
        assert "frozen BatchNorm statistics" in differs
    if config.optim.weight_decay == 0:
        assert "weight decay 0" in differs
    if loss == "rankmi":
        assert "beta0 until the critic has a root" in differs
        assert paper.nmi_source.startswith("sec. 4, Evaluation metrics")  # not sec. 5
    if loss == "proxyanchor":
        assert "evaluates after every epoch" in differs
    # bf16 runs wherever the hardware has it, CPUs included, and the table says which ran
    assert "CPUs with AVX512-BF16 or AMX, else fp32" in differs and "on CUDA (" not in differs


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"cite": ""}, "no cite"),
        ({"nmi": "harmonic"}, "nmi must be one of"),
        ({"metrics": {"recall@1": 60.0}}, "no cell for recall@2"),
        ({"missing": {}}, "map@r is empty and missing gives no reason"),
        ({"sources": {"map@r": "somewhere"}}, "sources cites map@r"),
        ({"metrics": {"recall@1": 160.0}}, "must be a percentage"),
        ({"selection": "sometimes"}, "selection must be one of"),
        ({"selection_source": " "}, "no selection_source"),
    ],
)
def test_a_broken_block_is_refused(change, expected, tmp_path):
    block = read_paper("rankmi_cub").to_dict()
    block.update(change)
    assert any(expected in problem for problem in problems(block, "cub")), problems(block, "cub")
    config = tmp_path / "broken.yaml"
    config.write_text(yaml.safe_dump({"data": {"dataset": "cub"}, "paper": block}))
    with pytest.raises(NearsightError, match="paper block"):
        read_paper(config)


def test_a_config_without_a_paper_block_is_named(tmp_path):
    config = tmp_path / "mine.yaml"
    config.write_text("steps: 10\n")
    with pytest.raises(NearsightError, match="has no paper: block"):
        read_paper(config)
    assert load_config(CONFIG_DIR / "rll_cub.yaml").loss.name == "rll"  # training ignores it


def test_the_docs_list_every_configs_differences():
    """docs/reproducing.md's per-config lists are the configs' paper.differs, word for word."""
    docs = (CONFIG_DIR.parents[2] / "docs" / "reproducing.md").read_text()
    for name in shipped_configs():
        section = docs.split(f"### `{name}`\n", 1)[1].split("\n### ", 1)[0]
        paper = read_paper(name)
        assert paper.selection_source in section, name
        for item in paper.differs:
            assert f"\n- {item}\n" in section, (name, item)
