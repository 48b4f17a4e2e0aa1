"""The examples of README.md and docs/*.md as tests, through Sybil (the repository's root
conftest.py hands pytest :data:`DOCUMENTS`).

What runs, in each document's own copy of the small data (tests/docs/workspace.py):

- ```` ```sh ```` blocks: their commands (tests/docs/shell.py says how);
- ```` ```python ```` blocks: as Python, in one namespace per document;
- ```` ```usage ```` blocks: a command-line synopsis, checked against the CLI's parser
  (tests/docs/usage.py);
- code spans in the prose: ```nearsight SUBCOMMAND ...``` (its flags exist), a file of the
  repository (it exists; tests/docs/references.py), a ``nearsight.`` Python name (it imports);
- ``<!-- invisible-code-block: python -->`` (or ``sh``) comments: checks of what the text
  around them says, unseen by a reader.

Two comments change how the next block runs:

- ``<!-- not-run: REASON -->``: it needs what a test cannot have (a benchmark's archive,
  ImageNet weights, a GPU, the network, hours). Its ``nearsight`` commands are parsed by the
  CLI's parser (a Python block is compiled), nothing runs, and it is reported skipped with
  REASON;
- ``<!-- xfail: REASON -->``: what it checks is known to be false (REASON names the issue); it
  must fail, and it fails the run once it passes, so the comment goes when the fix lands.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest
from sybil import Document, Example, Lexeme, Region, Sybil
from sybil.example import NotEvaluated
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer
from tests.docs.references import check_reference, is_reference
from tests.docs.shell import DOC_URL, DocWorkspace
from tests.docs.usage import ROOT, check_span, check_usage
from tests.docs.workspace import build_workspace, copy_workspace

SPAN = re.compile(r"(?<!`)`([^`]+)`(?!`)")
FENCED = re.compile(r"^```.*?^```|<!--.*?-->", re.MULTILINE | re.DOTALL)


class _NextBlock:
    """Runs the example after a ``not-run`` or ``xfail`` comment, then steps aside."""

    def __init__(self, directive: str, reason: str) -> None:
        self.directive, self.reason = directive, reason

    def __call__(self, example: Example) -> None:
        if "source" not in example.region.lexemes:
            raise NotEvaluated()  # a code span in the prose between the comment and its block
        example.document.pop_evaluator(self)
        if self.directive == "not-run":
            _check_without_running(example)
            pytest.skip(f"{Path(example.path).name}:{example.line}: {self.reason}")
        try:
            example.region.evaluator(example)
        except Exception as error:  # noqa: BLE001 (any failure is the expected one)
            first = str(error).strip().splitlines()[:1] or [type(error).__name__]
            pytest.xfail(f"{self.reason} [{first[0]}]")
        raise AssertionError(f"expected to fail ({self.reason}), and it passed: drop the xfail")


def _directive(example: Example) -> None:
    directive, reason = example.parsed
    example.document.push_evaluator(_NextBlock(directive, reason))


def directives(document: Document) -> Iterator[Region]:
    lexer = DirectiveInHTMLCommentLexer(directive=r"not-run|xfail", arguments=r".+?")
    for lexed in lexer(document):
        reason = lexed.lexemes["arguments"].strip()
        yield Region(lexed.start, lexed.end, (lexed.lexemes["directive"], reason), _directive)


def code_spans(document: Document) -> Iterable[Region]:
    """Code spans in the prose that name a subcommand, a file or a Python name."""
    fenced = [m.span() for m in FENCED.finditer(document.text)]
    for match in SPAN.finditer(document.text):
        if any(start <= match.start() < end for start, end in fenced):
            continue  # a block's own parser checks it
        text = " ".join(match.group(1).split())
        if text.startswith("nearsight "):
            yield Region(match.start(), match.end(), text, _check_command_span)
        elif is_reference(text):
            yield Region(match.start(), match.end(), text, _check_reference_span)


def _check_command_span(example: Example) -> str | None:
    return check_span(example.parsed)


def _check_reference_span(example: Example) -> str | None:
    return check_reference(example.parsed)


def _check_without_running(example: Example) -> None:
    language = example.region.lexemes.get("arguments")
    if language == "python":
        compile(str(example.parsed), example.path, "exec")
    elif language == "sh":
        example.namespace["docs_workspace"].check_block(str(example.parsed))


def _run_shell(example: Example) -> None:
    example.namespace["docs_workspace"].run_block(str(example.parsed))


def python_blocks(document: Document) -> Iterator[Region]:
    """Python blocks, run in the document's copy of the small data."""
    for region in PythonCodeBlockParser()(document):
        region.evaluator = _in_workspace(region.evaluator)
        yield region


def _in_workspace(evaluate: Callable[[Example], object]) -> Callable[[Example], object]:
    """Python runs in the document's copy of the small data; the address the docs show for a
    server is the one the document's latest ``nearsight serve`` listens on."""

    def evaluate_there(example: Example) -> object:
        workspace = example.namespace["docs_workspace"]
        workspace.path  # noqa: B018 (made, and the working folder)
        source = example.parsed
        if isinstance(source, Lexeme) and DOC_URL in source:
            text = source.replace(DOC_URL, workspace.url)
            example.parsed = Lexeme(text, source.offset, source.line_offset)
        return evaluate(example)

    return evaluate_there


DOCUMENTS = Sybil(
    parsers=[
        directives,
        CodeBlockParser("sh", _run_shell),
        CodeBlockParser("usage", lambda example: check_usage(str(example.parsed))),
        python_blocks,
        code_spans,
    ],
    path=str(ROOT),
    patterns=["README.md", "docs/*.md"],
    fixtures=["docs_workspace"],
)


@pytest.fixture(scope="session")
def docs_pristine(tmp_path_factory) -> Iterator[Callable[[], Path]]:
    """Makes the small data once, when a document first needs it (models included: about
    80 MB); removed at the end."""
    built: list[Path] = []

    def pristine() -> Path:
        if not built:
            built.append(build_workspace(tmp_path_factory.mktemp("docs") / "pristine"))
        return built[0]

    yield pristine
    for root in built:
        shutil.rmtree(root.parent, ignore_errors=True)


@pytest.fixture(scope="module")  # Sybil gives each document a module's scope
def docs_workspace(docs_pristine, tmp_path_factory) -> Iterator[DocWorkspace]:
    """A document's own copy of the small data, its working folder while its examples run."""
    folder = tmp_path_factory.mktemp("doc")
    workspace = DocWorkspace(lambda: copy_workspace(docs_pristine(), folder / "work"))
    try:
        yield workspace
    finally:
        workspace.close()
        shutil.rmtree(folder, ignore_errors=True)
