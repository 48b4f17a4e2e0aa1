"""The examples of README.md and docs/*.md run as tests: see tests/docs/examples.py."""

from tests.docs.examples import DOCUMENTS, docs_pristine, docs_workspace  # noqa: F401 (fixtures)

pytest_collect_file = DOCUMENTS.pytest()
