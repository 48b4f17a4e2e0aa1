"""The ``paper:`` block of a config: the published row a reproduction is compared against.

    paper:
      cite: authors, "title", venue          # the paper (or the authors' page the row is from)
      table: Table 1 (CUB-200-2011)          # where in it
      row: RankMI (Ours) 128R                # which row
      nmi: arithmetic                        # how the paper normalises NMI (or geometric)
      nmi_source: where the paper defines it
      selection: final                       # which network the paper reports (SELECTIONS)
      selection_source: where it says so (or why it is unstated)
      metrics: {recall@1: 66.7, ..., nmi: 71.3, map@r: null}   # percent; null = not known
      sources: {recall@1: "sec. 4.2 ..."}    # a cell taken from elsewhere than table/row
      missing: {map@r: "why it is empty"}    # every null cell, with its reason
      differs: ["what this config does differently, and why", ...]

Every number is cited (by ``table`` and ``row``, or by its own ``sources`` entry) and every
empty cell says why; :func:`problems` lists what breaks that rule. ``selection`` says which
network the paper's numbers are of: ``final`` (a fixed training length, its last network),
``best`` (the best of evaluations on the test split during training) or ``unstated``; the
reproduction table says "as the paper" only of the matching row.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nearsight.core.errors import NearsightError
from nearsight.data.metrics.nmi import NMI_AVERAGES
from nearsight.data.metrics.retrieval import CUB_KS, SOP_KS
from nearsight.training.config import PAPER_KEY, _config_text, parse_yaml

TEXT_FIELDS = ("cite", "table", "row", "nmi_source", "selection_source")
# which network a paper reports: its last (a fixed training length), its best test evaluation
# during training, or it does not say
SELECTIONS = ("final", "best", "unstated")


def protocol_metrics(dataset: str) -> list[str]:
    """The metrics a reproduction on ``dataset`` reports: the papers' Recall@k (CUB and CARS196
    at 1/2/4/8 with NMI; SOP at 1/10/100/1000, where NMI says little with 11k classes) and
    MAP@R."""
    if dataset == "sop":
        return [f"recall@{k}" for k in SOP_KS] + ["map@r"]
    return [f"recall@{k}" for k in CUB_KS] + ["nmi", "map@r"]


@dataclass
class PaperRow:
    cite: str
    table: str
    row: str
    nmi: str
    nmi_source: str
    selection: str
    selection_source: str
    metrics: dict[str, float | None]
    sources: dict[str, str] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    differs: list[str] = field(default_factory=list)

    def ks(self) -> list[int]:
        """The k of every Recall@k the row has a cell for."""
        return sorted(int(key.split("@")[1]) for key in self.metrics if key.startswith("recall@"))

    def citation(self, metric: str) -> str:
        return self.sources.get(metric) or f"{self.table}, row {self.row}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "cite": self.cite,
            "table": self.table,
            "row": self.row,
            "nmi": self.nmi,
            "nmi_source": self.nmi_source,
            "selection": self.selection,
            "selection_source": self.selection_source,
            "metrics": dict(self.metrics),
            "sources": dict(self.sources),
            "missing": dict(self.missing),
            "differs": list(self.differs),
        }


def read_paper(config: str | Path) -> PaperRow:
    """The ``paper:`` block of a config file (or a shipped config by name); refused with the
    list of what is wrong when it breaks the rules above."""
    path = Path(config)
    try:
        values = parse_yaml(_config_text(path)) or {}
    except FileNotFoundError:
        raise NearsightError(f"config file not found: {path}") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise NearsightError(f"cannot read config file {path}: {error}") from None
    block = values.get(PAPER_KEY) if isinstance(values, dict) else None
    if not isinstance(block, dict):
        raise NearsightError(f"config {path} has no paper: block (the row to compare against)")
    dataset = ((values.get("data") or {}).get("dataset")) or ""
    wrong = problems(block, dataset)
    if wrong:
        raise NearsightError(f"config {path}: paper block: {'; '.join(wrong)}")
    return PaperRow(
        cite=block["cite"],
        table=block["table"],
        row=block["row"],
        nmi=block["nmi"],
        nmi_source=block["nmi_source"],
        selection=block["selection"],
        selection_source=block["selection_source"],
        metrics={key: (None if v is None else float(v)) for key, v in block["metrics"].items()},
        sources=dict(block.get("sources") or {}),
        missing=dict(block.get("missing") or {}),
        differs=[str(item) for item in block.get("differs") or []],
    )


def problems(block: dict[str, Any], dataset: str) -> list[str]:
    """What makes ``block`` unusable: a missing citation, a number without one, an empty cell
    without a reason, a protocol metric without a cell, an unknown NMI normalisation or model
    selection."""
    found = [f"no {name}" for name in TEXT_FIELDS if not _text(block.get(name))]
    if block.get("nmi") not in NMI_AVERAGES:
        found.append(f"nmi must be one of {', '.join(NMI_AVERAGES)}")
    if block.get("selection") not in SELECTIONS:
        found.append(f"selection must be one of {', '.join(SELECTIONS)}")
    metrics = block.get("metrics")
    if not isinstance(metrics, dict) or not metrics:
        return [*found, "no metrics"]
    sources, missing = block.get("sources") or {}, block.get("missing") or {}
    for key in protocol_metrics(dataset):
        if key not in metrics:
            found.append(f"no cell for {key} (a number, or null with a reason in missing)")
    for key, value in metrics.items():
        if key != "nmi" and key != "map@r" and not _is_recall(key):
            found.append(f"unknown metric {key}")
        elif value is None:
            if not _text(missing.get(key)):
                found.append(f"{key} is empty and missing gives no reason")
        elif (
            not isinstance(value, numbers.Real)
            or isinstance(value, bool)
            or not 0 <= float(value) <= 100
        ):
            found.append(f"{key} must be a percentage, got {value!r}")
        elif key in missing:
            found.append(f"{key} has a number and a reason it is missing")
    for key in sources:
        if metrics.get(key) is None:
            found.append(f"sources cites {key}, which has no number")
        elif not _text(sources[key]):
            found.append(f"sources.{key} is empty")
    if not isinstance(block.get("differs", []), list):
        found.append("differs must be a list")
    return found


def _is_recall(key: str) -> bool:
    name, _, k = key.partition("@")
    return name == "recall" and k.isdigit() and int(k) > 0


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())
