"""Schemathesis against the OpenAPI document each architecture serves, V1 and V2 routes: no 5xx, and every
response conforms to the document (status, content type, body schema), for valid and invalid requests alike."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import CheckFunction
from schemathesis.core.result import Ok
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.conftest import ARCHS
from tests.serving import Server

#: Examples per operation and mode: enough to reach every status a route documents, bounded for CI.
EXAMPLES = 5
#: The per-model operations of these models (the others' differ only in their instance schema). Affine is left
#: out: its predict takes untyped instances and raises on a dict without "x" (a 500 by design: the model raised).
MODELS = ("iris", "echo")


def _in_scope(path: str) -> bool:
    if path.endswith("/ws"):
        # A WebSocket endpoint: its only plain-HTTP answers are 426 (async, hybrid) and 501 (sync, by design);
        # tests/live/test_websocket.py covers them and the streams themselves.
        return False
    if not path.startswith(("/v1/models/", "/v2/models/")) or path == "/v2/models/stats":
        return True
    name = path.split("/")[3].split(":")[0]
    return name in MODELS


@pytest.mark.hardening
@pytest.mark.parametrize("arch", ARCHS)
def test_every_operation_answers_within_its_schema(arch: str, well_behaved: dict[str, Server]) -> None:
    schema = schemathesis.openapi.from_url(f"{well_behaved[arch].url}/openapi.json")
    failures: dict[str, str] = {}
    operations = 0
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result  # an operation its own schema cannot describe
        operation = result.ok()
        if not _in_scope(operation.path):
            continue
        operations += 1
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
            def check(case: schemathesis.Case[Any]) -> None:
                # A V2 tensor's shape, datatype and data must agree, which JSON Schema cannot say: a request the
                # schema allows may rightly get 400 invalid_tensor. Every other check applies.
                excluded: list[CheckFunction] = []
                if case.operation.path.endswith("/infer"):
                    excluded.append(positive_data_acceptance)
                case.call_and_validate(excluded_checks=excluded)

            try:
                check()
            except Unsatisfiable:  # no parameters or body to make invalid (a plain GET): nothing to test negatively
                continue
            except (Exception, BaseExceptionGroup) as exc:  # every operation is tried; failures are reported together
                failures[f"{operation.label} ({mode.value})"] = str(exc)[:1500]
    assert operations >= 4 * len(MODELS) + 6
    assert not failures, "\n\n".join(f"{label}:\n{text}" for label, text in failures.items())
