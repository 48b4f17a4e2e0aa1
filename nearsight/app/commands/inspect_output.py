"""How `nearsight inspect` prints and writes its DataFrames: JSON records, CSV, text tables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

TEXT_ROWS = 20  # rows a terminal table shows (--json / --csv hold every row)


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows as JSON-ready dicts (NaN and missing values as null)."""
    return json.loads(frame.to_json(orient="records", force_ascii=False))


def print_json(value: object) -> None:
    print(json.dumps(value, ensure_ascii=False))


def write_csv(frame: pd.DataFrame, path: Path) -> None:
    from nearsight.core.atomic import atomic_file

    with atomic_file(path, "w") as handle:
        frame.to_csv(handle, index=False)


def print_table(frame: pd.DataFrame, rows: int = TEXT_ROWS, every: str = "--json or --csv") -> None:
    """The first ``rows`` rows as text, the empty columns left out."""
    if frame.empty:
        return
    shown = frame.head(rows).dropna(axis=1, how="all")
    print(shown.to_string(index=False, float_format=lambda value: f"{value:.4f}"))
    if len(frame) > rows:
        print(f"... {len(frame) - rows} more ({every} for every row)")
