"""What one V2 infer passes through in the async architecture, from the HTTP server to the model: the twinserve
functions it calls, their modules and their packages, for one or more checkouts side by side.

Each checkout (`--src DIR/src`) serves the built-in iris example with `twinserve serve --arch async` in a child
process, started as the CLI starts it, under a profile hook on every thread that records the functions entered
while one request is answered (after warm-up requests, so that nothing is imported or compiled on its way). Counted
are twinserve's own functions (not the libraries', nor uvicorn's, nor the model's), each once; "packages" are the
folders under `twinserve/` (a module at its top, `model.py` say, counts as the package `twinserve`). The profile
hook slows the server many times over: this counts, it does not time.

    python benchmarks/request_path.py [--src OLD/src --src NEW/src] [--list]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

MODEL, NAME = "twinserve.examples.tabular:Classifier", "iris"
BODY = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [5.1, 3.5, 1.4, 0.2]}]}

_CHILD = r"""
import http.client, json, os, signal, sys, threading, time

recorded, active = set(), [False]


def hook(frame, event, arg):
    if event == "call" and active[0]:
        recorded.add((frame.f_code.co_filename, frame.f_code.co_name))
    return None


def drive(port, body):
    deadline = time.monotonic() + 60
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("GET", "/v2/health/ready")
            if conn.getresponse().status == 200:
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            os._exit(3)
        time.sleep(0.2)

    def infer():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", f"/v2/models/{name}/infer", body, {"Content-Type": "application/json"})
        answer = conn.getresponse()
        answer.read()
        conn.close()
        return answer.status

    statuses = {infer() for _ in range(20)}
    if statuses != {200}:
        print(f"RECORDED {json.dumps({'status': sorted(statuses)[0], 'calls': []})}", flush=True)
        os._exit(4)
    active[0] = True
    status = infer()
    time.sleep(0.2)  # the request's log line and metrics, written after its answer
    active[0] = False
    print("RECORDED " + json.dumps({"status": status, "calls": sorted(recorded)}), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)


port, body, name = int(sys.argv[1]), sys.argv[2].encode(), sys.argv[4]
sys.setprofile(hook)
threading.setprofile(hook)
threading.Thread(target=drive, args=(port, body), daemon=True).start()
from twinserve.cli import main

sys.argv = ["twinserve", "serve", sys.argv[3], "--arch", "async", "--host", "127.0.0.1", "--port", str(port)]
main()
"""


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _path(src: str) -> list[tuple[str, str]]:
    """The twinserve functions one V2 infer entered, as (module path under twinserve/, function name)."""
    env = {**os.environ, "PYTHONPATH": os.path.abspath(src), "TWINSERVE_LOG_LEVEL": "warning"}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(_free_port()), json.dumps(BODY), MODEL, NAME],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = next((line for line in done.stdout.splitlines() if line.startswith("RECORDED ")), None)
    if line is None:
        sys.exit(f"{src}: no path recorded (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    recorded = json.loads(line.removeprefix("RECORDED "))
    if recorded["status"] != 200:
        sys.exit(f"{src}: the traced request was answered {recorded['status']}")
    root = Path(src).resolve() / "twinserve"
    calls = []
    for filename, name in recorded["calls"]:
        path = Path(filename)
        if path.is_relative_to(root) and "/examples/" not in filename:
            calls.append((str(path.relative_to(root)), name))
    return sorted(calls)


def _package(module: str) -> str:
    return module.split("/", 1)[0] if "/" in module else "twinserve"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", action="append", help="a checkout's src/ folder (repeat to compare)")
    parser.add_argument("--list", action="store_true", help="print every function counted")
    args = parser.parse_args()
    sources = args.src or [os.path.join(os.path.dirname(__file__), "..", "src")]
    print(f"{'checkout':<40} {'functions':>9} {'modules':>8} {'packages':>8}  packages")
    for src in sources:
        calls = _path(src)
        modules = sorted({module for module, _ in calls})
        packages = sorted({_package(module) for module in modules})
        print(f"{src:<40} {len(calls):>9} {len(modules):>8} {len(packages):>8}  {', '.join(packages)}")
        if args.list:
            for module, name in calls:
                print(f"    {module}:{name}")


if __name__ == "__main__":
    main()
