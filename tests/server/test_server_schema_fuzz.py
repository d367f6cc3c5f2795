"""A bounded schemathesis run against the real server's ``/openapi.json``: generated requests (valid
and invalid) to every documented route never get a 5xx, and every answer matches the document
(status, content type, body schema: the error shape included). The server is guarded as ``kvflow
serve`` guards its loopback default (Host check, JSON bodies only); the bodies' new fields
(``cache_salt``, strict hint fields, steps of any size) are in the document, so they are fuzzed too."""

from __future__ import annotations

from typing import Any, Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from server_helpers import Served, assert_no_leak

# schemathesis is in the test extra; a venv without it skips this module instead of failing to collect
schemathesis = pytest.importorskip("schemathesis")
from schemathesis.checks import not_a_server_error  # noqa: E402 - after the importorskip guard
from schemathesis.generation.modes import GenerationMode  # noqa: E402 - after the importorskip guard
from schemathesis.specs.openapi.checks import (  # noqa: E402 - after the importorskip guard
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from backends.server.crosssite import LOOPBACK_HOSTS  # noqa: E402 - after the importorskip guard
from server_helpers import start_server  # noqa: E402 - after the importorskip guard

EXAMPLES = 20  # per operation and mode: bounded so the whole run takes well under a minute on two cores
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with start_server(allowed_hosts=LOOPBACK_HOSTS) as s:
        yield s


def _operations(served: Served) -> list[Any]:
    schema = schemathesis.openapi.from_url(served.url + "/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_5xx_and_every_answer_matches_the_document(served: Served, client: httpx.Client,
                                                      mode: GenerationMode) -> None:
    operations = _operations(served)
    assert len(operations) >= 10
    components = client.get("/openapi.json").json()["components"]["schemas"]
    for body in ("ChatCompletionRequest", "CompletionRequest", "ResponsesRequest", "GenerateBody"):
        assert "cache_salt" in components[body]["properties"], body
    if mode is GenerationMode.NEGATIVE:  # only a body can be sent invalid (a path segment is any string)
        operations = [op for op in operations if op.method.upper() == "POST"]
    for operation in operations:
        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def run(case: Any) -> None:
            case.call_and_validate(checks=CHECKS, timeout=60)

        run()
    assert_no_leak(client)
