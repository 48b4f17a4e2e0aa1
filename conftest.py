"""The examples of README.md and docs/*.md run as tests: see tests/docs/examples.py."""

from tests.docs.examples import DOCUMENTS, docs_pristine, docs_workspace  # noqa: F401 (fixtures)

pytest_collect_file = DOCUMENTS.pytest()

# a run that leaves a process of its own behind fails (tests/process_check.py)
pytest_plugins = ["process_check"]
