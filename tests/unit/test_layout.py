"""twinserve's modules as the folders promise, read from the source (every import, in functions and TYPE_CHECKING
blocks too): no import cycle between its modules, no `_private` name taken from another module, `__all__` naming
public names only, and no module past 500 lines. Dunder names (`__version__`) are public, as Python has them.

tests/unit/test_architecture.py checks the packages' floors: which package may import which."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.import_graph import find_cycle
from tests.serving import ROOT

PACKAGE = ROOT / "src" / "twinserve"
MAX_LINES = 500


def _module(file: Path) -> str:
    name = ".".join(file.relative_to(PACKAGE.parent).with_suffix("").parts)
    return name.removesuffix(".__init__")


FILES = {_module(file): file for file in sorted(PACKAGE.rglob("*.py"))}
TREES = {module: ast.parse(file.read_text(), str(file)) for module, file in FILES.items()}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _absolute(module: str, node: ast.ImportFrom) -> str:
    """The module a `from ... import` names, a relative one (`from .x import y`) resolved against `module`."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if FILES[module].name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def _imports(module: str) -> list[tuple[str, str]]:
    """(twinserve module imported, name taken from it or "") for each twinserve import of `module`."""
    found: list[tuple[str, str]] = []
    for node in ast.walk(TREES[module]):
        if isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names if alias.name in FILES]
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node)
            for alias in node.names:
                if f"{source}.{alias.name}" in FILES:  # `from twinserve.core import wire`
                    found.append((f"{source}.{alias.name}", ""))
                elif source in FILES:
                    found.append((source, alias.name))
    return found


def _graph() -> dict[str, set[str]]:
    """Each module -> the modules it imports, with the packages a submodule's import runs first (importing
    `lab.report.svg` runs `lab/report/__init__.py`), except the importer's own."""
    graph: dict[str, set[str]] = {}
    for module in FILES:
        targets = {target for target, _ in _imports(module)} - {module}
        for target in list(targets):
            parts = target.split(".")
            for end in range(1, len(parts)):
                package = ".".join(parts[:end])
                if package in FILES and not f"{module}.".startswith(f"{package}."):
                    targets.add(package)
        graph[module] = targets
    return graph


def test_the_reader_sees_the_imports() -> None:
    """A guard against a test that cannot fail: the reader finds imports known to exist, and the walk finds a
    cycle where there is one."""
    graph = _graph()
    assert "twinserve.lab.loadgen" in graph["twinserve.lab.drivers"]
    assert {"twinserve.lab.report", "twinserve.lab.report.svg"} <= graph["twinserve.lab.tune.report"]
    assert ("twinserve.lab.report.rows", "format_errors") in _imports("twinserve.lab.report.plots")
    assert "twinserve.service.contract" in graph["twinserve.service.exchange"]  # under TYPE_CHECKING
    assert "twinserve.fronts.grpc" in graph["twinserve.fronts.asgi_lifespan"]  # in a function
    assert "twinserve.core.wire" in graph["twinserve.core.workers"]  # `from twinserve.core import wire`
    assert ("twinserve", "__version__") in _imports("twinserve.cli")
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_between_modules() -> None:
    cycle = find_cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_private_name_is_imported_from_another_module() -> None:
    wrong = [
        (module, target, name)
        for module in FILES
        for target, name in _imports(module)
        if _private(name) and target != module
    ]
    assert not wrong, wrong


def _all(tree: ast.Module) -> list[str]:
    """The names a module's `__all__` lists; none where it has none."""
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if any(isinstance(target, ast.Name) and target.id == "__all__" for target in targets):
            return list(ast.literal_eval(value))
    return []


def test_all_lists_public_names_only() -> None:
    assert "LoadSpec" in _all(TREES["twinserve.lab.loadgen"])
    assert "Config" in _all(TREES["twinserve.config"])
    wrong = [(module, name) for module, tree in TREES.items() for name in _all(tree) if _private(name)]
    assert not wrong, wrong


def test_every_module_is_small() -> None:
    long = {module: n for module, file in FILES.items() if (n := len(file.read_text().splitlines())) > MAX_LINES}
    assert not long, long
