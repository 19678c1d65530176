from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.serving import RedisServer, Server, ServerProcess, SharedServers, model_path, servers_per_arch
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


@pytest.fixture(scope="module")
def shared_servers() -> Iterator[SharedServers]:
    """The module's servers shared by flag set, each started on first use (tests/serving.py `SharedServers`)."""
    servers = SharedServers()
    try:
        yield servers
    finally:
        servers.stop()


# -- the layers (tests/README.md): collected slowest first, and servers started only in live/ ----------------------
TESTS = Path(__file__).resolve().parent
#: Slowest first: `--dist loadscope` hands modules out in collection order, so the many small modules of the lower
#: layers fill the workers' gaps at the end instead of one live module running on alone.
LAYER_ORDER = ("live", "contract", "wire", "unit")
#: The layers below tests/live/: a test there that starts a server process fails.
NO_SERVERS = ("unit", "wire", "contract")
_STARTED: Counter[str] = Counter()  # servers started per run, by kind: the terminal summary's last line
_STARTED_BY_MODULE: Counter[str] = Counter()  # `twinserve serve` starts by test module: where they cost the most
_start = ServerProcess.start
_running: list[Path] = []


def layer_of(path: Path) -> str | None:
    """The layer folder `path` is in; None for a file outside them (a helper at the top of tests/)."""
    parts = path.relative_to(TESTS).parts if path.is_relative_to(TESTS) else ()
    return parts[0] if len(parts) > 1 and parts[0] in LAYER_ORDER else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        layer = layer_of(item.path)
        return LAYER_ORDER.index(layer) if layer else len(LAYER_ORDER)

    items.sort(key=rank)  # stable: each module's own order is kept


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _running[:] = [item.path]  # before any fixture: a fixture's server is the test's that asked for it first


def _counted_start(self: Any) -> Any:
    if _running and layer_of(_running[0]) in NO_SERVERS:
        raise AssertionError(f"{_running[0]} starts a server process: move it to tests/live/ (tests/README.md)")
    _STARTED["twinserve serve" if isinstance(self, TwinserveServer) else type(self).__name__] += 1
    if isinstance(self, TwinserveServer) and _running:
        _STARTED_BY_MODULE[str(_running[0].relative_to(TESTS)) if _running[0].is_relative_to(TESTS) else "?"] += 1
    return _start(self)


ServerProcess.start = _counted_start  # type: ignore[method-assign]


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workeroutput"):  # an xdist worker: its counts go to the controller
        session.config.workeroutput["servers_started"] = dict(_STARTED)
        session.config.workeroutput["servers_by_module"] = dict(_STARTED_BY_MODULE)


@pytest.hookimpl(optionalhook=True)  # xdist's hook: absent with `-p no:xdist`
def pytest_testnodedown(node: Any, error: object) -> None:  # the xdist controller, as each worker finishes
    output = getattr(node, "workeroutput", {})
    _STARTED.update(output.get("servers_started", {}))
    _STARTED_BY_MODULE.update(output.get("servers_by_module", {}))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _STARTED:
        counts = ", ".join(f"{kind} {n}" for kind, n in _STARTED.most_common())
        terminalreporter.write_line(f"servers started: {sum(_STARTED.values())} ({counts})")
    if _STARTED_BY_MODULE:
        top = ", ".join(f"{module} {n}" for module, n in _STARTED_BY_MODULE.most_common(15))
        terminalreporter.write_line(f"twinserve serve started most by: {top}")
