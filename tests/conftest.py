from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.serving import RedisServer, Server, ServerProcess, model_path, servers_per_arch
from twinserve.examples.io import populate
from twinserve.lab.servers import TwinserveServer

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


# -- servers started per run (the terminal summary's last lines), and only in the layer that may --------------------
TESTS = Path(__file__).resolve().parent
#: The layers below tests/live/ (tests/README.md): a test there that starts a server process fails.
NO_SERVERS = ("unit", "wire", "contract")
_STARTED: Counter[str] = Counter()
_start = ServerProcess.start
_running: list[Path] = []


#: Collection order, slowest layer first: `--dist loadscope` hands modules out in this order, so the many small
#: modules of the lower layers fill the workers' gaps at the end instead of one live module running on alone.
LAYER_ORDER = ("live", "contract", "wire", "unit")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def layer(item: pytest.Item) -> int:
        parts = item.path.relative_to(TESTS).parts if item.path.is_relative_to(TESTS) else ()
        return LAYER_ORDER.index(parts[0]) if parts and parts[0] in LAYER_ORDER else len(LAYER_ORDER)

    items.sort(key=layer)  # stable: each module's own order is kept


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _running[:] = [item.path]  # before any fixture: a fixture's server is the test's that asked for it first


def _counted_start(self: Any) -> Any:
    if _running and _running[0].is_relative_to(TESTS) and _running[0].relative_to(TESTS).parts[0] in NO_SERVERS:
        raise AssertionError(f"{_running[0]} starts a server process: move it to tests/live/ (tests/README.md)")
    _STARTED["twinserve serve" if isinstance(self, TwinserveServer) else type(self).__name__] += 1
    return _start(self)


ServerProcess.start = _counted_start  # type: ignore[method-assign]


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workeroutput"):  # an xdist worker: its counts go to the controller
        session.config.workeroutput["servers_started"] = dict(_STARTED)


@pytest.hookimpl(optionalhook=True)  # xdist's hook: absent with `-p no:xdist`
def pytest_testnodedown(node: Any, error: object) -> None:  # the xdist controller, as each worker finishes
    _STARTED.update(getattr(node, "workeroutput", {}).get("servers_started", {}))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _STARTED:
        counts = ", ".join(f"{kind} {n}" for kind, n in _STARTED.most_common())
        terminalreporter.write_line(f"servers started: {sum(_STARTED.values())} ({counts})")
