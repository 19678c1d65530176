"""Rules of the suite itself (tests/README.md) that a reader cannot keep by eye across a hundred modules."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.serving import ROOT

#: httpx's module-level request functions: each builds a client, and with it a TLS context loading the CA bundle.
ONE_OFF = {"get", "post", "put", "patch", "delete", "head", "options", "request", "stream"}


def _one_off_calls(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return [
        f"{path}:{node.lineno} httpx.{node.func.attr}(...)"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "httpx"
        and node.func.attr in ONE_OFF
    ]


def test_one_off_requests_go_through_the_shared_client() -> None:
    """`httpx.get(...)` spends ~21 ms of CPU on a TLS context per request, for plain HTTP on loopback: a third of
    some live modules' time. `tests.serving.HTTP` keeps no connection between requests either."""
    found = [call for path in sorted((ROOT / "tests").rglob("*.py")) for call in _one_off_calls(path)]
    assert found == [], "use tests.serving.HTTP instead:\n" + "\n".join(found)


def test_the_rule_sees_a_one_off_request(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import httpx\n\nhttpx.get('http://127.0.0.1:1/')\nclient = httpx.Client()\n")
    assert _one_off_calls(sample) == [f"{sample}:3 httpx.get(...)"]
