"""The generated reference pages (scripts/gen_docs.py) match the code they are generated from."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


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
