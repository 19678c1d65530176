"""The folders show the architecture: which package may import which, read from the source (every import, in
functions and TYPE_CHECKING blocks too), and no import cycle between packages (between modules:
tests/unit/test_layout.py)."""

from __future__ import annotations

import ast
from collections import defaultdict

import pytest

from tests.import_graph import find_cycle
from tests.serving import ROOT

PACKAGE = ROOT / "src" / "twinserve"
#: What each part of twinserve must never import: the core knows no protocol, service, adapter, server, lab or
#: deployment; the service (the request's lifecycle, IO-free) knows no adapter (fronts/) and no server.
FORBIDDEN: dict[str, set[str]] = {
    "core": {"protocol", "service", "fronts", "servers", "lab", "deploy", "cli", "cli_args", "examples"},
    "protocol": {"service", "fronts", "servers", "lab", "deploy", "cli", "cli_args", "examples"},
    "service": {"fronts", "servers", "lab", "deploy", "cli", "cli_args", "examples"},
    "fronts": {"servers", "lab", "deploy", "cli", "cli_args", "examples"},
    "lab": {"service", "fronts", "servers", "deploy"},  # it starts servers as users do: subprocesses, from outside
    "model": {"core", "protocol", "service", "fronts", "servers", "lab", "deploy"},
    "config": {"core", "protocol", "service", "fronts", "servers", "lab", "deploy", "model"},
    "errors": {"core", "protocol", "service", "fronts", "servers", "lab", "deploy", "model", "config"},
}
#: Web frameworks, servers and transports are the adapters' (fronts/) and servers' business alone.
FRAMEWORKS = {"flask", "werkzeug", "fastapi", "starlette", "gunicorn", "uvicorn", "httptools"}
#: What moves bytes, besides the web frameworks: the service (its lifecycle, IO-free) imports none of it either.
TRANSPORTS = FRAMEWORKS | {"grpc", "h11", "socket", "selectors", "ssl", "websockets", "wsproto"}
TRANSPORT_FREE = ("core", "protocol", "service", "model", "config", "errors", "encoding", "observability")


def _part(module: str) -> str | None:
    """`twinserve.core.runtime` -> `core`; `twinserve.model` -> `model`; the package itself -> None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "twinserve" else None


def _imports() -> dict[str, set[tuple[str, str]]]:
    """Each part -> {(imported module, importing file)}."""
    found: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for file in PACKAGE.rglob("*.py"):
        module = ".".join(file.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        part = _part(module)
        if part is None:
            continue
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                found[part].add((name, str(file.relative_to(ROOT))))
    return found


IMPORTS = _imports()


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for part, imported in IMPORTS.items():
        for name, _ in imported:
            target = _part(name)
            if target is not None and target != part:
                graph[part].add(target)
    return graph


def test_the_import_reader_sees_the_imports() -> None:
    """A guard against a test that cannot fail: the reader finds imports known to exist."""
    graph = _graph()
    assert {"config", "errors", "observability"} <= graph["core"]
    assert {"core", "protocol", "service"} <= graph["fronts"]
    assert ("flask", "src/twinserve/fronts/wsgi.py") in IMPORTS["fronts"]
    assert ("twinserve.service.exchange", "src/twinserve/fronts/asgi.py") in IMPORTS["fronts"]


@pytest.mark.parametrize("part", sorted(FORBIDDEN))
def test_each_part_imports_nothing_above_it(part: str) -> None:
    wrong = sorted((name, file) for name, file in IMPORTS[part] if _part(name) in FORBIDDEN[part])
    assert not wrong, f"{part} must not import {sorted(FORBIDDEN[part])}: {wrong}"


@pytest.mark.parametrize("part", TRANSPORT_FREE)
def test_the_transport_free_parts_import_no_web_framework(part: str) -> None:
    wrong = sorted((name, file) for name, file in IMPORTS[part] if name.split(".")[0] in FRAMEWORKS)
    assert not wrong, wrong


def test_the_service_imports_no_transport() -> None:
    wrong = sorted((name, file) for name, file in IMPORTS["service"] if name.split(".")[0] in TRANSPORTS)
    assert not wrong, wrong


def test_no_import_cycle_between_packages() -> None:
    cycle = find_cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
