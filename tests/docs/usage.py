"""What the docs say about the command line, checked against the CLI's own parser: the
``usage`` blocks (a synopsis: every flag a subcommand has, its choices and defaults), the
``nearsight ...`` commands of blocks that are not run (parsed, not run) and the
``nearsight ...`` code spans in the prose (each flag exists)."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# a word of a synopsis that stands for a value rather than being one: FILE, N, KEY=VALUE, ...
PLACEHOLDER = re.compile(r"[A-Z]|\.\.\.")


@cache
def subcommands() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every leaf subcommand's parser by its words: ("index", "build") -> its parser."""
    from nearsight.app.cli import build_parser

    found: dict[tuple[str, ...], argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> None:
        nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not nested:
            found[words] = parser
        for action in nested:
            for name, child in action.choices.items():
                walk(child, (*words, name))

    walk(build_parser(), ())
    return found


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The parser's flags (``--help`` aside) and their actions."""
    return {
        flag: action
        for action in parser._actions
        for flag in action.option_strings
        if flag not in ("-h", "--help")
    }


def resolve(words: list[str]) -> tuple[list[tuple[str, ...]], list[str]]:
    """The subcommands that ``nearsight`` + ``words`` names (``build/import`` names two) and the
    words after them; no subcommand when the words name none."""
    known = subcommands()
    prefixes = {key[:size] for key in known for size in range(1, len(key) + 1)}
    paths: list[tuple[str, ...]] = [()]
    rest = list(words)
    while rest and not rest[0].startswith("-"):
        longer = [(*path, word) for path in paths for word in rest[0].split("/")]
        if not all(path in prefixes for path in longer):
            break
        paths, rest = longer, rest[1:]
    return [path for path in paths if path in known], rest


def flags_in(words: list[str]) -> list[str]:
    return [word.split("=")[0] for word in words if re.fullmatch(r"--[a-z][a-z0-9-]*(=.*)?", word)]


def check_span(text: str) -> str | None:
    """A ``nearsight ...`` code span: it names a subcommand, and each flag exists there."""
    words = text.split()[1:]
    if words in ([], ["--help"]):
        return None
    paths, rest = resolve(words)
    if not paths:
        return f"`{text}`: no such subcommand"
    problems = [
        f"`{text}`: nearsight {' '.join(path)} has no {flag}"
        for path in paths
        for flag in flags_in(rest)
        if flag not in options(subcommands()[path]) and flag != "--help"
    ]
    return "\n".join(problems) or None


def parse_command(argv: list[str]) -> str | None:
    """``nearsight`` + ``argv`` parsed by the CLI's own parser and not run: its error, if any."""
    from nearsight.app.cli import build_parser

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            build_parser().parse_args(argv)
        except SystemExit as exit:
            if exit.code:
                return f"`nearsight {shlex.join(argv)}`: {err.getvalue().strip()}"
    missing = [
        word for word in argv if word.startswith("nearsight/") and not (ROOT / word).exists()
    ]
    if missing:
        return f"`nearsight {shlex.join(argv)}`: {', '.join(missing)} not in the repository"
    return None


def check_usage(text: str) -> str | None:
    """A synopsis block: every flag it lists exists in its subcommand, with the choices and the
    default it shows, and every flag of a subcommand it shows is listed."""
    problems: list[str] = []
    listed: dict[tuple[str, ...], set[str]] = {}
    for words in _entries(text):
        paths, rest = resolve(words[1:])
        if not paths:
            problems.append(f"{' '.join(words[:3])}: no such subcommand")
            continue
        for path in paths:
            seen = listed.setdefault(path, set())
            problems += _check_entry(path, rest, seen)
    for path, seen in listed.items():
        for flag in sorted(set(options(subcommands()[path])) - seen):
            problems.append(f"nearsight {' '.join(path)}: {flag} is not in the synopsis")
    return "\n".join(problems) or None


def _entries(text: str) -> Iterator[list[str]]:
    """One word list per command: a line starting with ``nearsight`` and the indented lines
    after it; brackets and parentheses dropped."""
    entry: list[str] = []
    for line in text.splitlines():
        words = re.findall(r"[^\s\[\]()]+", line)
        if line.startswith("nearsight"):
            if entry:
                yield entry
            entry = words
        elif line[:1].isspace() and entry:
            entry += words
    if entry:
        yield entry


def _check_entry(path: tuple[str, ...], words: list[str], seen: set[str]) -> list[str]:
    parser = subcommands()[path]
    by_flag = options(parser)
    positionals = [a for a in parser._actions if not a.option_strings and a.choices]
    name = f"nearsight {' '.join(path)}"
    problems: list[str] = []
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if word.startswith("{") and positionals:
            problems += _check_choices(name, positionals[0], word)
        if not word.startswith("--"):
            continue
        action = by_flag.get(word)
        if action is None:
            problems.append(f"{name} has no {word}")
            continue
        seen.update(action.option_strings)
        values: list[str] = []
        limit = {None: 1, "?": 1, 0: 0}.get(action.nargs, action.nargs)
        while index < len(words) and not words[index].startswith("--") and words[index] != "|":
            if isinstance(limit, int) and len(values) >= limit:
                break
            values.append(words[index])
            index += 1
        problems += _check_values(name, word, action, values)
    return problems


def _check_values(name: str, flag: str, action: argparse.Action, values: list[str]) -> list[str]:
    if not values or any(PLACEHOLDER.search(value) for value in values):
        return []  # FILE, N, ...: nothing to compare
    if action.choices and ("|" in values[0] or values[0].startswith("{")):
        return _check_choices(f"{name} {flag}", action, values[0])
    default = action.default
    if default is None or default is False or default == []:
        return []  # chosen elsewhere (a config's default): the synopsis may show it
    shown = values if isinstance(default, list) else values[:1]
    expected = default if isinstance(default, list) else [default]
    if len(shown) != len(expected) or not all(map(_same, shown, expected)):
        return [f"{name} {flag}: the synopsis shows {' '.join(values)}, the default is {default}"]
    return []


def _check_choices(name: str, action: argparse.Action, word: str) -> list[str]:
    shown = set(re.split(r"[|,]", word.strip("{}")))
    if shown != {str(choice) for choice in action.choices}:
        return [f"{name}: the synopsis shows {word}, the choices are {sorted(action.choices)}"]
    return []


def _same(shown: str, default: object) -> bool:
    with contextlib.suppress(ValueError, TypeError):
        return float(shown) == float(default)  # type: ignore[arg-type]
    return shown == str(default)
