"""The generated reference pages (scripts/gen_docs.py) match the code they are generated from, and every test that
docs/guarantees.md names as a promise's proof is a test function of its file (read with `ast`, never imported)."""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
GUARANTEES = ROOT / "docs" / "guarantees.md"
#: Where docs/guarantees.md's test paths start, unless they start with `tests/` (then from the repository root).
LIVE = ROOT / "tests" / "live"
ARCHS = ("sync", "async", "hybrid")
#: An inline code span that names a test: `file.py`, `file.py::name` or `::name` (a test of the file named before it
#: on the same line: a table row is one line), each optionally followed by parametrisation ids in brackets.
TEST_REFERENCE = re.compile(r"(?P<file>(?:[\w.-]+/)*test_\w+\.py)?(?:::(?P<name>\w+))?(?:\[(?P<ids>[^\]]*)\])?")


def _gen_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_docs", module)
    spec.loader.exec_module(module)
    return module


gen_docs = _gen_docs()


def test_generated_pages_are_current() -> None:
    stale = gen_docs.check(ROOT / "docs")
    assert stale == [], f"stale generated pages {stale}: run `python scripts/gen_docs.py`"


def test_check_names_a_stale_missing_or_orphaned_page(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs" / "reference", docs / "reference")
    assert gen_docs.main(["--check", "--docs-dir", str(docs)]) == 0

    errors = docs / "reference" / "errors.md"
    errors.write_text(errors.read_text(encoding="utf-8").replace("| 504 |", "| 500 |"), encoding="utf-8")
    (docs / "reference" / "metrics.md").unlink()
    (docs / "reference" / "gone.md").write_text(gen_docs.HEADER + "\n", encoding="utf-8")
    assert gen_docs.check(docs) == ["reference/errors.md", "reference/metrics.md", "reference/gone.md"]
    assert gen_docs.main(["--check", "--docs-dir", str(docs)]) == 1

    gen_docs.main(["--docs-dir", str(docs)])  # rewriting repairs what it generates; an orphan stays stale
    assert gen_docs.check(docs) == ["reference/gone.md"]


def test_every_page_says_it_is_generated() -> None:
    for rel, text in gen_docs.render_pages().items():
        assert text.startswith(gen_docs.HEADER), rel
        assert "|---|" in text, f"{rel} holds no table"


def _test_references(text: str) -> list[tuple[int, str, str | None, str | None]]:
    """(line number, file, function or None, ids or None) of each test reference in `text`, in order."""
    found: list[tuple[int, str, str | None, str | None]] = []
    for number, line in enumerate(text.splitlines(), 1):
        file = ""  # `::name` with no file before it on its line is reported as such
        for span in re.findall(r"`([^`]+)`", line):
            match = TEST_REFERENCE.fullmatch(span)
            if match is None or not (match["file"] or match["name"]):
                continue
            file = match["file"] or file
            found.append((number, file, match["name"], match["ids"]))
    return found


def _test_file(reference: str) -> Path:
    return ROOT / reference if reference.startswith("tests/") else LIVE / reference


def _literal(node: ast.expr, names: dict[str, object]) -> object:
    """`node`'s value where it is a literal or a name bound to one (else None)."""
    if isinstance(node, ast.Name):
        return names.get(node.id)
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def _assigned(tree: ast.Module) -> dict[str, object]:
    """The module's top-level names bound to literals (`ARCHS = ("sync", ...)`)."""
    names: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                names[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return names


CONFTEST_NAMES = _assigned(ast.parse((ROOT / "tests" / "conftest.py").read_text(encoding="utf-8")))


def _tests(file: Path) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """The test functions of `file`, module-level and in classes, by name; `arch_values` reads their `arch` list."""
    tree = ast.parse(file.read_text(encoding="utf-8"), str(file))
    bodies = [tree.body] + [node.body for node in tree.body if isinstance(node, ast.ClassDef)]
    functions = (node for body in bodies for node in body)
    return {f.name: f for f in functions if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}


def _arch_values(function: ast.FunctionDef | ast.AsyncFunctionDef, names: dict[str, object]) -> set[str] | None:
    """The architectures a `@pytest.mark.parametrize("arch", ...)` of `function` lists, where that list is a
    literal or a name bound to one; None where the function has none (a fixture may still choose them)."""
    for decorator in function.decorator_list:
        if not (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)):
            continue
        if decorator.func.attr != "parametrize" or len(decorator.args) < 2:
            continue
        if _literal(decorator.args[0], {}) == "arch":
            values = _literal(decorator.args[1], names)
            if isinstance(values, list | tuple) and all(isinstance(v, str) for v in values):
                return {str(v) for v in values}
    return None


def _reference_problems(text: str) -> list[str]:
    """What is wrong with the test references in `text`: a missing file, a name that is no test function of its
    file, `::name` with no file before it, or an architecture in the ids that the test's `arch` list leaves out."""
    problems = []
    for number, file, name, ids in _test_references(text):
        where = f"line {number}: `{file}::{name}`" if name else f"line {number}: `{file}`"
        if not file:
            problems.append(f"{where}: no file named before it on its line")
            continue
        path = _test_file(file)
        if not path.is_file():
            problems.append(f"{where}: no file {path.relative_to(ROOT)}")
            continue
        if name is None:
            continue
        tests = _tests(path)
        if name not in tests:
            problems.append(f"{where}: no function {name} in {path.relative_to(ROOT)}")
            continue
        claimed = set(re.findall(r"\b(?:sync|async|hybrid)\b", ids or ""))
        names = {**CONFTEST_NAMES, **_assigned(ast.parse(path.read_text(encoding="utf-8")))}
        listed = _arch_values(tests[name], names)
        if listed is not None and not claimed <= listed:
            problems.append(f"{where}: claims {sorted(claimed - listed)}, its arch list is {sorted(listed)}")
    return problems


def test_every_test_the_guarantees_name_exists() -> None:
    text = GUARANTEES.read_text(encoding="utf-8")
    named = [ref for ref in _test_references(text) if ref[2] is not None]
    assert len(named) > 50, "docs/guarantees.md names fewer tests than it did: is the reference format still parsed?"
    assert _reference_problems(text) == []


def test_a_wrong_test_name_a_lost_file_or_an_untested_architecture_is_named() -> None:
    faults = "hardening/test_faults.py"
    http, redis = (
        "test_killed_http_worker_is_replaced_and_only_its_requests_fail",
        "test_redis_outage_is_503_naming_the_store_and_recovers",
    )
    early = "hardening/test_early_refusal.py::test_a_full_queue_is_answered_before_the_app_with_its_own_503"
    ws = "test_auth.py::test_websocket_handshakes_need_a_key"
    rows = [
        f"| ok | `{faults}::{http}[sync,async]`, `::{redis}[*]`, `{early}[hybrid]` (its fixture chooses) |",
        f"| renamed | `{faults}::{redis}`, `::test_gone` |",
        f"| no file | `::{redis}` |",
        "| moved | `hardening/test_nowhere.py::test_x`, `tests/unit/test_docs.py`, `tests/unit/test_nope.py` |",
        f"| sync | `{ws}[sync,async]` |",
        "| not a test | `servers/asgi/protocol.py::HttpProtocol`, `benchmarks/overload.py`, `[sync,async]` |",
    ]
    assert _reference_problems("\n".join(rows)) == [
        f"line 2: `{faults}::test_gone`: no function test_gone in tests/live/{faults}",
        f"line 3: `::{redis}`: no file named before it on its line",
        "line 4: `hardening/test_nowhere.py::test_x`: no file tests/live/hardening/test_nowhere.py",
        "line 4: `tests/unit/test_nope.py`: no file tests/unit/test_nope.py",
        f"line 5: `{ws}`: claims ['sync'], its arch list is ['async', 'hybrid']",
    ]
