"""Sync vs async on the same model and the same load, side by side in one run.

Starts `twinserve serve MODEL --arch sync` and `--arch async` (the CLI, as users run it; async once with the
seed's single worker and once with as many workers as sync) on loopback, drives each with wrk (Debian package
`wrk`) at several connection counts with the same POST body, and prints req/s, P50/P99 latency, errors and the
throughput ratio against sync per level. Figures are from this machine and this
run only: quote ratios, not absolutes.

    python benchmarks/sync_vs_async.py [--model twinserve.examples.tabular:Classifier] [--connections 1,16,64]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.serving import Server

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
    return float(value) * _UNITS[unit]


def wrk(url: str, body: bytes, connections: int, seconds: int) -> dict[str, float]:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(
            'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
            f"wrk.body = {json.dumps(body.decode())}\n"
        )
    out = subprocess.run(
        [
            "wrk",
            "-t",
            str(min(connections, 2)),
            "-c",
            str(connections),
            "-d",
            f"{seconds}s",
            "--latency",
            "-s",
            script.name,
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 60,
    ).stdout
    Path(script.name).unlink()
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    errors = (int(non_2xx.group(1)) if non_2xx else 0) + (sum(map(int, socket.groups())) if socket else 0)
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
        "p50": _ms(re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1)),  # type: ignore[union-attr]
        "p99": _ms(re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1)),  # type: ignore[union-attr]
        "errors": errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="twinserve.examples.tabular:Classifier")
    parser.add_argument("--connections", default="1,16,64")
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--workers", default="2", help="server processes for sync and the second async setup")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt-get install -y wrk)")
    levels = [int(c) for c in args.connections.split(",")]
    setups = {
        f"sync {args.workers}w": ("sync", ["--workers", args.workers]),  # gunicorn gthread, 4 threads per worker
        "async 1w": ("async", ["--workers", "1"]),  # the seed's `uvicorn --workers 1 --loop uvloop`
        f"async {args.workers}w": ("async", ["--workers", args.workers]),  # same process count as sync
    }
    results: dict[str, dict[int, dict[str, float]]] = {}
    for label, (arch, extra) in setups.items():
        with Server([args.model], arch, *extra) as server:
            name = httpx.get(server.url + "/v1/models").json()["models"][0]["name"]
            meta = httpx.get(f"{server.url}/v1/models/{name}").json()
            body = json.dumps({"instances": meta["examples"][:1]}).encode()
            url = f"{server.url}/v1/models/{name}:predict"
            wrk(url, body, 4, 2)  # warm-up
            results[label] = {c: wrk(url, body, c, args.seconds) for c in levels}
    baseline = next(iter(setups))
    print(f"model {args.model}; wrk on the same machine; ratios against {baseline!r}")
    print(f"{'conns':>5} | {'setup':>9} | {'req/s':>8} | {'P50 ms':>7} | {'P99 ms':>7} | {'errors':>6} | ratio")
    for c in levels:
        for label, by_level in results.items():
            r = by_level[c]
            ratio = r["rps"] / results[baseline][c]["rps"]
            print(
                f"{c:>5} | {label:>9} | {r['rps']:>8.0f} | {r['p50']:>7.2f} | {r['p99']:>7.2f} | "
                f"{r['errors']:>6.0f} | {ratio:.2f}"
            )


if __name__ == "__main__":
    main()
