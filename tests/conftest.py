from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.serving import RedisServer, Server, model_path, servers_per_arch
from twinserve.examples.io import populate

ARCHS = ("sync", "async", "hybrid")

#: Everything the contract suite exercises, served together by one server per architecture.
CONTRACT_MODELS = (
    "twinserve.examples.tabular:Classifier",
    "twinserve.examples.io:FeatureLookup",
    *(
        model_path(name)
        for name in ("Echo", "AsyncEcho", "Mixed", "Faulty", "Mismatch", "Gate", "WhereAmI", "Affine", "Sensors")
    ),
)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    populate(server.url, entities=100)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def servers(redis_server: RedisServer) -> Iterator[dict[str, Server]]:
    """One running server per architecture, same models and settings (started once for the session)."""

    def make(arch: str) -> Server:
        return Server(
            CONTRACT_MODELS,
            arch,
            "--workers",
            "2",
            "--threads",
            "8",
            "--max-body-bytes",
            "65536",
            "--redis-url",
            redis_server.url,
        )

    with servers_per_arch(ARCHS, make) as started:
        yield started


@pytest.fixture(params=ARCHS)
def server(request: pytest.FixtureRequest, servers: dict[str, Server]) -> Server:
    return servers[request.param]
