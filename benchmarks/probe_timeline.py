"""What a Kubernetes probe sees while a model loads: `twinserve serve` of a model whose `load()` takes LOAD_S seconds,
probed from the moment the process starts, in each architecture.

Every PERIOD_S the script asks `GET /v2/health/live` and `GET /v2/health/ready` (a connection refused, before the
server says where it listens, counts as "not listening"), and prints when the answers changed, in seconds since
the process started. A model's load should be visible as live 200 and ready 503 (`Retry-After`) from the port's
binding to the load's end; then both 200.

    python benchmarks/probe_timeline.py [--load-s 8] [--archs sync,async,hybrid]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from twinserve.lab.servers import announced_url

PERIOD_S = 0.1
#: The model: the built-in iris example, whose load first sleeps as long as asked.
SLOW_MODEL = """
import os, time
from twinserve.examples.tabular import Classifier

class SlowIris(Classifier):
    def load(self) -> None:
        time.sleep(float(os.environ["SLOW_LOAD_S"]))
        super().load()
"""


def _state(client: httpx.Client, url: str | None) -> str:
    if url is None:
        return "not listening"
    answers = []
    for path in ("/v2/health/live", "/v2/health/ready"):
        try:
            answers.append(str(client.get(url + path).status_code))
        except httpx.TransportError:
            return "not listening"
    return f"live {answers[0]}, ready {answers[1]}"


def timeline(arch: str, load_s: float, folder: Path) -> list[tuple[float, str]]:
    """The probe answers' changes over one start, until ready 200 (or 60 s past the load)."""
    env = {**os.environ, "PYTHONPATH": f"{folder}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env["SLOW_LOAD_S"] = str(load_s)
    command = [sys.executable, "-m", "twinserve", "serve", "slow_iris:SlowIris", "--arch", arch, "--port", "0"]
    started = time.monotonic()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output: list[str] = []
    assert process.stdout is not None
    reader = threading.Thread(target=lambda: output.extend(process.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    changes: list[tuple[float, str]] = []
    try:
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() - started < load_s + 60 and process.poll() is None:
                url = announced_url("".join(output))
                state = _state(client, url)
                if not changes or changes[-1][1] != state:
                    changes.append((time.monotonic() - started, state))
                if state == "live 200, ready 200":
                    break
                time.sleep(PERIOD_S)
    finally:
        process.terminate()
        process.wait(timeout=60)
    return changes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load-s", type=float, default=8.0)
    parser.add_argument("--archs", default="sync,async,hybrid")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "slow_iris.py").write_text(SLOW_MODEL)
        for arch in args.archs.split(","):
            print(f"{arch} (load {args.load_s:g} s, probed every {PERIOD_S:g} s):")
            for at, state in timeline(arch, args.load_s, Path(folder)):
                print(f"  {at:6.2f} s  {state}")


if __name__ == "__main__":
    main()
