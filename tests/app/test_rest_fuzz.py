"""Property-based fuzzing of the REST API from its own OpenAPI schema (schemathesis), against
the real server on 127.0.0.1 over a tiny ONNX gallery: no generated request gets a 5xx, and
every answer conforms to the schema (its status is declared, its body matches that status's
model, its content type is declared). Bounded in examples per operation so that it fits in
`make test`."""

from __future__ import annotations

import pytest
import schemathesis
from helpers import running_page
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]

EXAMPLES_PER_OPERATION = 40


@pytest.fixture(scope="module")
def served(onnx_gallery):
    with running_page([onnx_gallery.gallery]) as (url, _demo):
        yield url.rstrip("/")


def test_every_answer_conforms_to_the_schema(served):
    schema = schemathesis.openapi.from_url(f"{served}/api/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.label for op in operations} >= {
        "POST /search", "GET /items/{item_id}", "GET /items/by-key", "GET /health",
        "GET /galleries",
    }  # fmt: skip
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None,
                  suppress_health_check=list(HealthCheck), database=None)  # fmt: skip
        def fuzz(case) -> None:
            case.call_and_validate(base_url=f"{served}/api", checks=CHECKS, timeout=30)

        fuzz()
