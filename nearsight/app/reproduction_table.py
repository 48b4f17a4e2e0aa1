"""The reproduction's report: the paper's row beside ours, as reproduction.md and .json.

Numbers are percentages, as the papers print them; the difference is ours minus the paper's,
in points. The JSON holds the same table and everything the Markdown says in words.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nearsight.core.atomic import atomic_file
from nearsight.training.paper import PaperRow, protocol_metrics

if TYPE_CHECKING:
    from nearsight.app.reproduction import Reproduction
    from nearsight.training.config import TrainConfig

LABELS = {"nmi": "NMI", "map@r": "MAP@R"}
SELECTION_NOTES = {
    "test": "chosen on the test classes, as the papers report (optimistic: the test split "
    "picks the checkpoint); `--selection val` chooses on held-out training classes instead",
    "val": "chosen on classes held out of the training split (the honest protocol); the row "
    "'ours, best test evaluation' is the papers' choice on the same run",
}


def columns(paper: PaperRow, dataset: str, ours: dict[str, Any]) -> list[str]:
    """Recall@k by k, then NMI, then MAP@R: every metric the paper or the protocol has."""
    names = set(paper.metrics) | (set(protocol_metrics(dataset)) & set(ours))
    recalls = sorted((n for n in names if n.startswith("recall@")), key=lambda n: int(n[7:]))
    return recalls + [n for n in ("nmi", "map@r") if n in names]


def build_report(
    repro: Reproduction, paper: PaperRow, config: TrainConfig, state: dict[str, Any]
) -> dict[str, Any]:
    out = repro.out
    measured = json.loads((out / "metrics.json").read_text())["metrics"]
    trained = json.loads((out / "train" / "result.json").read_text())
    dataset = config.data.dataset
    names = columns(paper, dataset, measured)
    ours = {n: _percent(measured.get(n)) for n in names}
    difference = {
        n: None
        if ours[n] is None or paper.metrics.get(n) is None
        else round(ours[n] - paper.metrics[n], 4)
        for n in names
    }
    stages = state["stages"]
    seconds = {name: stages[name]["seconds"] for name in stages}
    best_test = _best_test_evaluation(out, names, paper) if repro.selection == "val" else None
    return {
        "config": repro.config,
        "dataset": dataset,
        "columns": names,
        "paper": {n: paper.metrics.get(n) for n in names},
        "ours": ours,
        "difference": difference,
        # under --selection val, also the papers' protocol: the best test evaluation of the run
        "ours_best_test": best_test,
        "citation": {
            "cite": paper.cite,
            "table": paper.table,
            "row": paper.row,
            "sources": paper.sources,
            "missing": {
                n: paper.missing.get(n, "not in the paper's row")
                for n in names
                if paper.metrics.get(n) is None
            },
        },
        "nmi": {"average": paper.nmi, "source": paper.nmi_source},
        "selection": {
            "protocol": repro.selection,
            "selected_by": trained["selected_by"],
            "best_step": trained["best_step"],
            "steps": trained["steps"],
        },
        "settings_differ": {"config": paper.differs, "overrides": _overrides(repro)},
        "wall_seconds": {**seconds, "total": round(sum(seconds.values()), 2)},
        "train_seconds": stages.get("train", {}).get("train_seconds"),
        "device": stages.get("train", {}).get("device"),
        "processes": stages.get("train", {}).get("processes", 1),
        "queries": measured.get("queries"),
    }


def write_report(
    repro: Reproduction, paper: PaperRow, config: TrainConfig, state: dict[str, Any]
) -> dict[str, Any]:
    report = build_report(repro, paper, config, state)
    markdown = render(report)
    with atomic_file(repro.out / "reproduction.json", "w") as handle:
        json.dump(report, handle, indent=2)
    with atomic_file(repro.out / "reproduction.md", "w") as handle:
        handle.write(markdown)
    print(markdown, end="")
    return report


def render(report: dict[str, Any]) -> str:
    names, cite = report["columns"], report["citation"]
    digits = 2 if any(_decimals(v) > 1 for v in report["paper"].values()) else 1
    header = "| | " + " | ".join(LABELS.get(n, n.replace("recall", "R")) for n in names) + " |"
    lines = [
        f"# Reproduction of {report['config']} ({report['dataset']})",
        "",
        f'Paper: {cite["cite"]}; {cite["table"]}, row "{cite["row"]}".',
        "",
        header,
        "|" + "---|" * (len(names) + 1),
        _row("paper", [report["paper"][n] for n in names], digits),
        _row("ours", [report["ours"][n] for n in names], digits),
        _row("ours - paper", [report["difference"][n] for n in names], digits, sign=True),
    ]
    best_test = report.get("ours_best_test")
    if best_test is not None:
        lines.append(_row("ours, best test evaluation", [best_test[n] for n in names], digits))
    lines += [
        "",
        f"Percent; ours on {report['queries']} test images, each querying all the others.",
    ]
    if best_test is not None:
        lines.append(
            f"- ours, best test evaluation: the papers' protocol on the same run, the training "
            f"evaluation (step {best_test['step']}) with the best test Recall@1; an upper bound"
        )
    for name, source in cite["sources"].items():
        lines.append(f"- paper {name}: {source}")
    for name, reason in cite["missing"].items():
        lines.append(f"- paper {name} empty: {reason}")
    nmi = report["nmi"]
    lines.append(
        f"- NMI: {nmi['average']} mean of the two entropies, as the paper ({nmi['source']})"
    )
    selection = report["selection"]
    lines += [
        "",
        f"Model selection: best.pt is step {selection['best_step']} of {selection['steps']}, by "
        f"{selection['selected_by']}: {SELECTION_NOTES[selection['protocol']]}.",
        "",
        "Settings that differ from the paper:",
    ]
    lines += [f"- {item}" for item in report["settings_differ"]["config"]]
    for key, change in report["settings_differ"]["overrides"].items():
        lines.append(
            f"- `--set {key}={_shown(change['value'])}` (the config: {_shown(change['config'])})"
        )
    wall = report["wall_seconds"]
    parts = ", ".join(f"{name} {wall[name]:.0f}s" for name in wall if name != "total")
    train = report["train_seconds"]
    in_batches = f"; {train:.0f}s of it in training batches" if train is not None else ""
    lines += [
        "",
        f"Wall time: {wall['total']:.0f}s ({parts}{in_batches}; each stage as timed by the "
        f"run that completed it). Device: {report['device']}"
        + (f", {report['processes']} processes (torchrun)." if report["processes"] > 1 else "."),
    ]
    return "\n".join(lines) + "\n"


def _best_test_evaluation(out: Path, names: list[str], paper: PaperRow) -> dict[str, Any] | None:
    """The run's evaluation with the best test Recall@1 (metrics.jsonl), in percent: what the
    papers would report for it. Its NMI is the arithmetic one the trainer logs, so it is shown
    only where the paper uses that."""
    path = out / "train" / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not records:
        return None
    best = max(records, key=lambda record: record.get("recall@1", -1.0))
    shown = {n: _percent(best.get(n)) for n in names}
    if paper.nmi != "arithmetic":
        shown["nmi"] = None
    return {**shown, "step": best["step"]}


def _row(label: str, values: list[float | None], digits: int, sign: bool = False) -> str:
    def cell(value: float | None) -> str:
        if value is None:
            return "-"
        return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"

    return f"| {label} | " + " | ".join(cell(v) for v in values) + " |"


def _shown(value: Any) -> str:
    """A setting as it is written in YAML and on the command line (false, 1e-4, imagenet)."""
    return value if isinstance(value, str) else json.dumps(value)


def _percent(value: Any) -> float | None:
    return None if value is None else round(100 * float(value), 4)


def _decimals(value: float | None) -> int:
    if value is None:
        return 0
    text = f"{value}"
    return len(text.split(".")[1].rstrip("0")) if "." in text else 0


def _overrides(repro: Reproduction) -> dict[str, dict[str, Any]]:
    """Each --set with the config file's own value (what the paper's row was meant to run)."""
    from nearsight.training.config import load_config

    base = load_config(repro.config)
    changes = {}
    for key, value in repro.overrides.items():
        node: Any = dataclasses.asdict(base)
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node != value:
            changes[key] = {"value": value, "config": node}
    return changes
