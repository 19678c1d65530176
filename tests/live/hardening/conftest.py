from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import ARCHS
from tests.serving import Server, model_path

#: A typed model (V1 schema from pydantic, V2 tensors derived), an untyped one, and one that declares its V2
#: tensors (for binary tensor data). No failure built in, unlike the contract suite's Faulty or Mismatch.
WELL_BEHAVED = ("twinserve.examples.tabular:Classifier", model_path("Echo"), model_path("Affine"))
#: Small limits, so that the nasties reach them cheaply.
MAX_BODY_BYTES = 1 << 20
READ_TIMEOUT_S = 2


@pytest.fixture(scope="module")
def well_behaved() -> Iterator[dict[str, Server]]:
    """One server per architecture for the bad-input tests, started once for the module."""
    started: dict[str, Server] = {}
    try:
        for arch in ARCHS:
            started[arch] = Server(
                WELL_BEHAVED,
                arch,
                *("--workers", "1", "--threads", "4", "--max-body-bytes", str(MAX_BODY_BYTES)),
                *("--read-timeout-s", str(READ_TIMEOUT_S)),
            ).start()
        yield started
    finally:
        for server in started.values():
            server.stop()
