"""CSV files read within bounds: every CSV reader of nearsight (the csv dataset's manifest, the
meta file of ``index import``) goes through :func:`read_table`.

Python's csv module reads whatever a line holds: a header of a million column names became a
million-key dict per row, and rows of a million fields grew the reader by gigabytes. Here:

- the header is read first, from at most :data:`MAX_HEADER_CHARS` characters, and may name at
  most :data:`MAX_COLUMNS` columns (SQLite's own limit, where the columns end up);
- a line is at most :data:`MAX_LINE_CHARS` characters, and a row may not hold more fields than
  the header names;
- a short row is never widened: its dict holds the columns it has (a reader asks for the
  others with ``row.get``).

Every refusal is a one-line :class:`~nearsight.core.errors.NearsightError` naming the file and
the line.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from typing import TextIO

from nearsight.core.errors import NearsightError

MAX_COLUMNS = 2000  # SQLite's SQLITE_MAX_COLUMN default
MAX_HEADER_CHARS = MAX_COLUMNS * 256
MAX_LINE_CHARS = 4 * 1024 * 1024


class CsvTable:
    """The header of a CSV file and an iterator over its rows (see the module docstring)."""

    def __init__(self, handle: TextIO, where: str):
        self.where = where
        self._lines = _bounded_lines(handle, where)
        header_line = _first_line(handle, where)
        header = next(csv.reader([header_line]), []) if header_line else []
        if len(header) > MAX_COLUMNS:
            raise NearsightError(f"{where}: the header names {len(header)} columns; at most "
                                 f"{MAX_COLUMNS}")  # fmt: skip
        self.columns = [name.strip() for name in header]
        self.line_num = 1

    def rows(self) -> Iterator[tuple[int, dict[str, str]]]:
        """(line number, the row's fields by column name) for each row after the header."""
        reader = csv.reader(self._lines)
        width = len(self.columns)
        for values in reader:
            line = reader.line_num + 1
            if not values:
                continue  # a blank line
            if len(values) > width:
                raise NearsightError(f"{self.where} line {line}: {len(values)} fields, but the "
                                     f"header names {width} columns")  # fmt: skip
            yield line, dict(zip(self.columns, values, strict=False))


def read_table(handle: TextIO, where: str) -> CsvTable:
    """The bounded table of an open CSV file (``where``: its name in messages)."""
    return CsvTable(handle, where)


def _first_line(handle: TextIO, where: str) -> str:
    line = handle.readline(MAX_HEADER_CHARS + 1)
    if len(line) > MAX_HEADER_CHARS and not line.endswith("\n"):
        raise NearsightError(f"{where}: the header is longer than {MAX_HEADER_CHARS} characters "
                             f"(at most {MAX_COLUMNS} columns)")  # fmt: skip
    return line


def _bounded_lines(handle: TextIO, where: str) -> Iterator[str]:
    number = 1
    while True:
        line = handle.readline(MAX_LINE_CHARS + 1)
        if not line:
            return
        number += 1
        if len(line) > MAX_LINE_CHARS and not line.endswith("\n"):
            raise NearsightError(f"{where} line {number}: longer than {MAX_LINE_CHARS} "
                                 "characters")  # fmt: skip
        yield line
