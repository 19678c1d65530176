"""The lab's modules as the folders promise: read from the source (every import, in functions and TYPE_CHECKING
blocks too), no import cycle between its modules, no `_private` name taken from another module, `__all__` naming
public names only, and no module past 500 lines."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.serving import ROOT

LAB = ROOT / "src" / "twinserve" / "lab"
MAX_LINES = 500


def _module(file: Path) -> str:
    name = ".".join(file.relative_to(LAB.parent.parent).with_suffix("").parts)
    return name.removesuffix(".__init__")


FILES = {_module(file): file for file in sorted(LAB.rglob("*.py"))}
TREES = {module: ast.parse(file.read_text(), str(file)) for module, file in FILES.items()}


def _imports(module: str) -> list[tuple[str, str]]:
    """(lab module imported, name taken from it or "") for each lab import of `module`."""
    found: list[tuple[str, str]] = []
    for node in ast.walk(TREES[module]):
        if isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names if alias.name in FILES]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                if f"{node.module}.{alias.name}" in FILES:  # `from twinserve.lab import drivers`
                    found.append((f"{node.module}.{alias.name}", ""))
                elif node.module in FILES:
                    found.append((node.module, alias.name))
    return found


def _graph() -> dict[str, set[str]]:
    """Each lab module -> the lab modules it imports, with the packages a submodule's import runs first (importing
    `lab.report.svg` runs `lab/report/__init__.py`), except the importer's own."""
    graph: dict[str, set[str]] = {}
    for module in FILES:
        targets = {target for target, _ in _imports(module)} - {module}
        for target in list(targets):
            parts = target.split(".")
            for end in range(3, len(parts)):
                package = ".".join(parts[:end])
                if package in FILES and not f"{module}.".startswith(f"{package}."):
                    targets.add(package)
        graph[module] = targets
    return graph


def test_the_reader_sees_the_imports() -> None:
    """A guard against a test that cannot fail: the reader finds imports known to exist."""
    graph = _graph()
    assert "twinserve.lab.loadgen" in graph["twinserve.lab.drivers"]
    assert {"twinserve.lab.report", "twinserve.lab.report.svg"} <= graph["twinserve.lab.tune.report"]
    assert ("twinserve.lab.report.rows", "format_errors") in _imports("twinserve.lab.report.plots")


def test_no_import_cycle_between_lab_modules() -> None:
    graph = _graph()
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                cycle = [*path[path.index(target) :], target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target, [*path, target])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


def test_no_private_name_is_imported_from_another_lab_module() -> None:
    wrong = [
        (module, target, name)
        for module in FILES
        for target, name in _imports(module)
        if name.startswith("_") and target != module
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
    wrong = [(module, name) for module, tree in TREES.items() for name in _all(tree) if name.startswith("_")]
    assert not wrong, wrong


def test_every_lab_module_is_small() -> None:
    long = {module: n for module, file in FILES.items() if (n := len(file.read_text().splitlines())) > MAX_LINES}
    assert not long, long
