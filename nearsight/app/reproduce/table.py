"""The reproduction's report: the paper's row beside ours, as reproduction.md and .json.

Numbers are percentages, as the papers print them; the difference is ours minus the paper's,
in points. The JSON holds the same table and everything the Markdown says in words.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import yaml

from nearsight.core.atomic import atomic_file
from nearsight.training.paper import PaperRow, protocol_metrics

if TYPE_CHECKING:
    from nearsight.training.config import TrainConfig


class Reproduction(Protocol):
    """What the report reads of a reproduction (nearsight.app.reproduce.run's, which imports
    this module)."""

    config: str
    out: Path
    overrides: dict[str, Any]
    selection: str


LABELS = {"nmi": "NMI", "map@r": "MAP@R"}
# how best.pt was chosen (--selection)
SELECTION_NOTES = {
    "test": "chosen on the test classes (optimistic: the test split picks the checkpoint); "
    "`--selection val` chooses on held-out training classes instead",
    "val": "chosen on classes held out of the training split (the honest protocol); the row "
    "'ours, best test evaluation' is the best test evaluation of the same run",
}
# which of our rows follows the paper's own choice of network (paper.selection)
PAPER_SELECTION_NOTES = {
    "best": "The paper reports its best test evaluation during training ({source}): the row "
    "'{row}' follows that protocol.",
    "final": "The paper reports the network at the end of a fixed training length ({source}): "
    "the row 'ours, final step' follows that protocol ('ours, final step - paper' compares "
    "it).",
    "unstated": "Which network the paper reports is not known: {source}. Compare with both "
    "'ours' and 'ours, final step'.",
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
    difference = _difference(ours, paper, names)
    stages = state["stages"]
    seconds = {name: stages[name]["seconds"] for name in stages}
    evaluations = _evaluations(out)
    nmi_shown = _training_nmi(out) == paper.nmi  # the trainer's NMI is the paper's
    best_test = None
    if repro.selection == "val" and evaluations:
        best = max(evaluations, key=lambda record: record.get("recall@1", -1.0))
        best_test = _evaluation_row(best, names, nmi_shown)
    # the trainer evaluates at the end of every run: its last record is the final network's
    final = _evaluation_row(evaluations[-1], names, nmi_shown) if evaluations else None
    train = stages.get("train", {})
    return {
        "config": repro.config,
        "dataset": dataset,
        "columns": names,
        "paper": {n: paper.metrics.get(n) for n in names},
        "ours": ours,
        "difference": difference,
        # the network at the end of training (the trainer's final evaluation of the test split)
        "ours_final_step": final,
        # ours, final step - paper: the comparison that follows a paper reporting its final
        # network (paper.selection final), shown then and when the paper does not say
        "difference_final_step": None if final is None else _difference(final, paper, names),
        # under --selection val, also the best test evaluation of the run
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
            "paper": paper.selection,
            "paper_source": paper.selection_source,
        },
        "settings_differ": {
            "config": paper.differs,
            "protocol": _protocol_differences(repro, config),
            "overrides": _overrides(repro),
        },
        "wall_seconds": {**seconds, "total": round(sum(seconds.values()), 2)},
        "train_seconds": train.get("train_seconds"),
        "train_resumed": bool(train.get("resumed", False)),
        "device": train.get("device"),
        # the arithmetic the training ran in (bf16 autocast or fp32; None: a run folder from
        # before it was recorded)
        "precision": train.get("precision"),
        "precision_detail": train.get("precision_detail"),
        "processes": train.get("processes", 1),
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
    final, best_test = report.get("ours_final_step"), report.get("ours_best_test")
    if final is not None:
        lines.append(_row("ours, final step", [final[n] for n in names], digits))
        final_difference = report.get("difference_final_step")
        if final_difference is not None and report["selection"]["paper"] != "best":
            values = [final_difference[n] for n in names]
            lines.append(_row("ours, final step - paper", values, digits, sign=True))
    if best_test is not None:
        lines.append(_row("ours, best test evaluation", [best_test[n] for n in names], digits))
    selection = report["selection"]
    lines += [
        "",
        f"Percent; ours on {report['queries']} test images, each querying all the others.",
        f"- ours: best.pt (step {selection['best_step']}), exported, indexed and evaluated",
    ]
    if final is not None:
        lines.append(
            f"- ours, final step: the network after the last training step (step "
            f"{final['step']}), from the training's final evaluation of the test split"
        )
    if best_test is not None:
        lines.append(
            f"- ours, best test evaluation: the training evaluation (step {best_test['step']}) "
            f"with the best test Recall@1 on the same run; an upper bound"
        )
    if any(row is not None and row.get("nmi_hidden") for row in (final, best_test)):
        lines.append(
            f"- NMI of the training's evaluations not shown: they used another average than "
            f"the paper's ({report['nmi']['average']})"
        )
    for name, source in cite["sources"].items():
        lines.append(f"- paper {name}: {source}")
    for name, reason in cite["missing"].items():
        lines.append(f"- paper {name} empty: {reason}")
    nmi = report["nmi"]
    if report["paper"].get("nmi") is not None:
        lines.append(
            f"- NMI: {nmi['average']} mean of the two entropies, as the paper ({nmi['source']})"
        )
    elif "nmi" in names:
        lines.append(
            f"- NMI: {nmi['average']} mean of the two entropies; the paper reports no NMI "
            f"({nmi['source']})"
        )
    paper_row = "ours" if selection["protocol"] == "test" else "ours, best test evaluation"
    paper_note = PAPER_SELECTION_NOTES[selection["paper"]].format(
        source=selection["paper_source"], row=paper_row
    )
    lines += [
        "",
        f"Model selection: best.pt is step {selection['best_step']} of {selection['steps']}, by "
        f"{selection['selected_by']}: {SELECTION_NOTES[selection['protocol']]}. {paper_note}",
        "",
        "Settings that differ from the paper:",
    ]
    differ = report["settings_differ"]
    lines += [f"- {item}" for item in [*differ["config"], *differ.get("protocol", [])]]
    for key, change in report["settings_differ"]["overrides"].items():
        lines.append(
            f"- `--set {key}={_shown(change['value'])}` (the config: {_shown(change['config'])})"
        )
    lines += ["", _wall_time(report)]
    return "\n".join(lines) + "\n"


def _wall_time(report: dict[str, Any]) -> str:
    """The stages' wall time and the training batches' time, each saying what it counts: a
    stage is timed by the invocation that completed it (a resumed training's earlier
    invocations are not in it), the training batches over every invocation."""
    wall = report["wall_seconds"]
    parts = ", ".join(f"{name} {wall[name]:.0f}s" for name in wall if name != "total")
    text = f"Wall time: {wall['total']:.0f}s ({parts}), each stage as timed by the invocation "
    text += "that completed it"
    if report.get("train_resumed"):
        text += " (the training was resumed: the invocations before the last are not counted)"
    train = report["train_seconds"]
    if train is not None:
        text += f". Training batches: {train:.0f}s over the whole training"
        if report.get("train_resumed"):
            text += ", every invocation included"
        text += " (evaluations and checkpoints excluded)"
    device = f". Device: {report['device']}"
    if report["processes"] > 1:
        device += f", {report['processes']} processes (torchrun)"
    precision = report.get("precision")
    if precision:
        device += f". Precision: {precision} ({report.get('precision_detail')})"
    else:
        device += ". Precision: not recorded (a run folder from an older nearsight)"
    return text + device + "."


def _difference(ours: dict[str, Any], paper: PaperRow, names: list[str]) -> dict[str, float | None]:
    """Ours minus the paper's, in points, where both have a number."""
    return {
        n: None
        if ours.get(n) is None or paper.metrics.get(n) is None
        else round(ours[n] - paper.metrics[n], 4)
        for n in names
    }


def _evaluations(out: Path) -> list[dict[str, Any]]:
    """The training's evaluations of the test split (metrics.jsonl), in step order."""
    path = out / "train" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _training_nmi(out: Path) -> str:
    """How the training's evaluations normalised NMI (runs from before the setting: arithmetic)."""
    saved = yaml.safe_load((out / "train" / "config.yaml").read_text()) or {}
    return str(saved.get("nmi_average") or "arithmetic")


def _evaluation_row(record: dict[str, Any], names: list[str], nmi_shown: bool) -> dict[str, Any]:
    """One training evaluation as a table row, in percent; its NMI only where it is the
    paper's."""
    shown: dict[str, Any] = {n: _percent(record.get(n)) for n in names}
    if "nmi" in shown and not nmi_shown:
        shown["nmi"], shown["nmi_hidden"] = None, True
    return {**shown, "step": record["step"]}


def _protocol_differences(repro: Reproduction, config: TrainConfig) -> list[str]:
    """What the chosen protocol changes from the paper's training: --selection val trains on
    the training classes it does not hold out."""
    held = config.data.val_classes
    if repro.selection != "val" or not held:
        return []
    if held < 1:
        share = f"{held:.0%} of the training classes"
    else:
        share = f"{held:g} training class{'es' if held != 1 else ''}"
    return [
        f"`--selection val`: {share} held out (data.val_classes = {held:g}) to choose best.pt, "
        f"so every network of the run trained on the other classes only; the paper trains on "
        f"all of them"
    ]


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
