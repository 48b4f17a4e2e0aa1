"""``nearsight index facets``: what the items a filter allows hold, column by column (the most
frequent text values with exact counts, number and date ranges with a histogram)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register_facets(actions: argparse._SubParsersAction) -> None:
    facets = actions.add_parser(
        "facets",
        help="count the values of a gallery's columns among the items a filter allows",
        description="For each text column the most frequent values with exact counts, for "
        "each number and date column its range and a histogram, counted over the items every "
        "--filter allows (all items without one).",
    )
    facets.add_argument("--gallery", type=Path, required=True, help="gallery folder")
    facets.add_argument("--filter", action="append", default=[], metavar="F",
                        help="KEY=VALUE, KEY=A|B, KEY!=V, KEY>=N ...; repeat: all must hold")  # fmt: skip
    facets.add_argument("--top", type=int, default=10, help="values per text column (default 10)")
    facets.add_argument("--bins", type=int, default=10,
                        help="histogram bins per number or date column (default 10)")  # fmt: skip
    facets.add_argument("--json", action="store_true", help="print one JSON object")
    facets.set_defaults(func=run_facets)


def run_facets(args: argparse.Namespace) -> int:
    import sys

    from nearsight.index.catalog.filters import parse_filters
    from nearsight.index.gallery.core import Gallery
    from nearsight.search.facets import gallery_facets

    conditions = parse_filters(args.filter)  # a bad filter fails before the gallery opens
    with Gallery.open(args.gallery) as gallery:
        found = gallery_facets(gallery, conditions, args.top, args.bins)
    for note in found.notes:
        print(f"nearsight: note: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps(found.as_dict(), ensure_ascii=False))
        return 0
    print(f"{found.items} items")
    for column in found.columns:
        print(f"{column.key} ({column.type}, {column.missing} without a value)")
        if column.histogram:
            print(f"  range {column.low} .. {column.high}")
            for low, high, count in column.histogram:
                print(f"  {_shown(low)} .. {_shown(high)}: {count}")
        for value, count in column.values:
            print(f"  {value}: {count}")
        if column.distinct > len(column.values):
            print(f"  ({column.distinct - len(column.values)} more values)")
    return 0


def _shown(edge: float | str) -> str:
    return f"{edge:.6g}" if isinstance(edge, float) else edge
