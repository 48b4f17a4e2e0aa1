"""``nearsight inspect``: a gallery's failures to share, a self-contained HTML report, two
galleries of the same items compared, suspected wrong labels, duplicate images and where in two
images their similarity comes from (nearsight/search/inspect/, whose functions return pandas
DataFrames; this module only parses and prints)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nearsight.app.commands.inspect_output import print_json, print_table, records, write_csv
from nearsight.core.errors import NearsightError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="failures, a report, two models compared, suspected labels, duplicates, why a match",
        description="Inspect a gallery from its stored embeddings: leave-one-out failures "
        "(every labelled item queries all the others), an HTML report, a comparison with "
        "another gallery of the same items, suspected wrong labels, duplicate images, and "
        "the similarity of two items drawn over their images.",
    )
    actions = parser.add_subparsers(dest="inspect_command", metavar="ACTION", required=True)

    failures = actions.add_parser(
        "failures",
        help="each leave-one-out failure: key, class, top-1, nearest same-class item, margin",
        description="List the labelled items whose nearest other item is of another class, "
        "worst (largest margin = nearest same-class distance - top-1 distance) first.",
    )
    _gallery(failures)
    out = failures.add_mutually_exclusive_group()
    out.add_argument(
        "--json", action="store_true", help="print a JSON list, one object per failure"
    )
    out.add_argument("--csv", type=Path, metavar="FILE", help="write every failure to a CSV file")
    out.add_argument(
        "--html", type=Path, metavar="FILE", help="write the HTML report (as `inspect report`)"
    )
    failures.set_defaults(func=run_failures)

    report = actions.add_parser(
        "report",
        help="one self-contained HTML file: Recall@k, worst classes, confused pairs, failures",
        description="Write one HTML file with the gallery's Recall@k, the classes with the "
        "lowest Recall@1, the class pairs most often confused and the worst failures with "
        "their grids. Thumbnails are inlined: the file makes no request to any host.",
    )
    _gallery(report)
    report.add_argument("--out", type=Path, required=True, help="the HTML file to write")
    report.add_argument("--k", type=int, default=8, help="neighbours in each grid (default 8)")
    report.add_argument(
        "--failures", type=int, default=50, metavar="N",
        help="failures drawn with their grids, worst first (default 50)",
    )  # fmt: skip
    report.set_defaults(func=run_report)

    compare = actions.add_parser(
        "compare",
        help="two galleries of the same items: queries fixed, broken, wrong in both",
        description="Compare --gallery with the baseline --against on the items both hold "
        "(matched by key, else by path): leave-one-out top-1 in each, over those items only. "
        "fixed: right in --gallery, wrong in --against; broken: the reverse. Recall@1 of "
        "each and a 95% paired bootstrap interval on the difference.",
    )
    _gallery(compare)
    compare.add_argument(
        "--against", type=Path, required=True, metavar="GALLERY", help="the baseline gallery"
    )
    compare.add_argument("--json", action="store_true", help="print one JSON object")
    compare.add_argument(
        "--csv", type=Path, metavar="FILE", help="write every query's row to a CSV"
    )
    compare.set_defaults(func=run_compare)

    labels = actions.add_parser(
        "labels",
        help="suspected wrong labels, ranked, each with the label its neighbours suggest",
        description="Rank labelled items by how strongly their nearest neighbours disagree "
        "with their label: confident learning (cleanlab) on class probabilities from the "
        "k nearest neighbours' labels.",
    )
    _gallery(labels)
    labels.add_argument("--top", type=int, default=20, metavar="N", help="rows (default 20)")
    labels.add_argument(
        "--neighbours", type=int, default=50, metavar="K", help="votes per item (default 50)"
    )
    labels.add_argument("--json", action="store_true", help="print a JSON list")
    labels.set_defaults(func=run_labels)

    from nearsight.app.commands.inspect_pixels import register_pixels

    register_pixels(actions, _gallery)


def _gallery(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gallery", type=Path, required=True, help="gallery folder")


def run_failures(args: argparse.Namespace) -> int:
    from nearsight.search.inspect.failures import inspect_failures
    from nearsight.search.inspect.report import write_report

    if args.html is not None:
        written = write_report(args.gallery, args.html)
        print(f"wrote {args.html}: {len(written.failure_list)} failures", file=sys.stderr)
        return 0
    report = inspect_failures(args.gallery)
    frame = report.failures
    if args.json:
        print_json(records(frame))
    elif args.csv is not None:
        write_csv(frame, args.csv)
        print(f"wrote {len(frame)} failures to {args.csv}", file=sys.stderr)
    else:
        queries = report.metrics["queries"]
        print(
            f"{len(frame)} of {queries} labelled items fail leave-one-out (top-1 of another class)"
        )
        shown = frame[["id", "key", "class", "top1_id", "top1_class", "top1_distance",
                       "positive_id", "positive_distance", "margin"]]  # fmt: skip
        print_table(shown)
    return 0


def run_report(args: argparse.Namespace) -> int:
    from nearsight.search.inspect.report import write_report

    _positive(k=args.k, failures=args.failures)
    report = write_report(args.gallery, args.out, k=args.k, max_failures=args.failures)
    recall = report.metrics.get("recall@1")
    print(
        f"wrote {args.out}: recall@1 {recall:.4f}, {len(report.failure_list)} failures "
        f"of {report.metrics['queries']} queries"
    )
    return 0


def run_compare(args: argparse.Namespace) -> int:
    from nearsight.search.inspect.compare import compare_galleries

    comparison = compare_galleries(args.gallery, args.against)
    if args.csv is not None:
        write_csv(comparison.items, args.csv)
    if args.json:
        changed = comparison.items[comparison.items["verdict"].isin(["fixed", "broken"])]
        print_json(comparison.summary() | {"changed": records(changed)})
        return 0
    low, high = comparison.interval
    counts = comparison.counts
    print(
        f"{comparison.queries} queries (items matched by {comparison.matched_by}): "
        f"recall@1 {comparison.recall_gallery:.4f} vs {comparison.recall_baseline:.4f} "
        f"(baseline), delta {comparison.delta:+.4f}, 95% interval [{low:+.4f}, {high:+.4f}]"
    )
    print(
        f"fixed {counts['fixed']}, broken {counts['broken']}, wrong in both "
        f"{counts['wrong in both']}, right in both {counts['right in both']}"
    )
    changed = comparison.items[comparison.items["verdict"].isin(["fixed", "broken"])]
    print_table(changed[["id", "key", "class", "verdict", "top1_class", "baseline_top1_class"]])
    return 0


def run_labels(args: argparse.Namespace) -> int:
    from nearsight.search.inspect.labels import suspected_labels

    _positive(top=args.top, neighbours=args.neighbours)
    frame = suspected_labels(args.gallery, top=args.top, k=args.neighbours)
    if args.json:
        print_json(records(frame))
        return 0
    print(f"{len(frame)} suspected labels, most suspicious first (confident learning, cleanlab)")
    print_table(frame[["rank", "id", "key", "class", "suggested class", "label quality"]],
                rows=args.top)  # fmt: skip
    return 0


# -- output ------------------------------------------------------------------------------------


def _positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise NearsightError(f"--{name} must be at least 1, got {value}")
