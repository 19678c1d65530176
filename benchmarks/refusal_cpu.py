"""CPU of a refusal against a served request's, per architecture (issue #16: a refusal under 10% of a 200).

Two servers per architecture, each serving the iris example and a model that holds its predict until released
(tests/models.py:Gate). On the first, whose queue holds the load, iris is driven by wrk at `--connections` for
`--seconds`: the server's CPU over the 200s answered is a served request's CPU. On the second (`--max-queue 1`),
Gate's predict is held and its queue filled (gated requests are sent until a plain one is refused), and wrk drives
Gate's predict URL the same way: every answer is a 503 `queue_full`, and the server's CPU over them is a refusal's.
(Until 2026-12-03 one server with `--max-queue 1` did both, and most of its "200s" were 503s.) CPU is the server's
process tree's (user + system: the kernel's share of each exchange counts); wrk runs on the same cores but outside
it. Not CI.

With `--profile DIR`, py-spy samples the server tree during the refusal run and the script prints where a
refusal's CPU goes (self time per function, and the stack's frames below the protocol's entry point).

    python benchmarks/refusal_cpu.py [--archs sync,async,hybrid] [--seconds 5] [--connections 64]
                                     [--src OLD/src --src NEW/src] [--profile DIR]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from common import ROOT, require_wrk, wrk
from cputime import tree_cpu_seconds

from twinserve.lab.servers import TwinserveServer

IRIS = b'{"instances": [{"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}]}'
PLAIN = b'{"instances": [{"gate": "/nonexistent/never-held"}]}'
SERVED_FLAGS = ("--workers", "1", "--max-batch-size", "8", "--max-queue", "1024")  # a batch queue, never full here
FLAGS = (*SERVED_FLAGS[:4], "--max-queue", "1", "--max-queue-wait-ms", "0")  # Gate's queue, full after one
MODELS = ("twinserve.examples.tabular:Classifier", f"{ROOT / 'tests' / 'models.py'}:Gate")


def _hold(url: str, gate: Path, stop: threading.Event) -> None:
    body = json.dumps({"instances": [{"gate": str(gate)}]}).encode()
    try:
        httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=120)
    except httpx.HTTPError:
        if not stop.is_set():
            raise


def _fill(url: str, folder: Path, stop: threading.Event) -> list[threading.Thread]:
    """Gated requests until a plain one is refused: Gate's predict is held and its queue full. A plain request
    not answered within a second is queued (the sync front's request threads are all held): it stays queued."""
    held: list[threading.Thread] = []
    for n in range(16):
        try:
            probe = httpx.post(url, content=PLAIN, headers={"content-type": "application/json"}, timeout=1.0)
            if probe.status_code == 503:
                return held
        except httpx.TimeoutException:
            pass
        thread = threading.Thread(target=_hold, args=(url, folder / f"g{n}", stop), daemon=True)
        thread.start()
        held.append(thread)
        time.sleep(0.3)  # it reaches predict or the queue
    raise RuntimeError("Gate's queue never filled")


def _profile(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    args = ["py-spy", "record", "-p", str(pid), "--subprocesses", "--gil", "-r", "400", "-d", str(int(seconds) + 1)]
    return subprocess.Popen([*args, "-f", "raw", "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def _summarise(raw: Path, top: int = 25) -> None:
    """Self samples per function, and inclusive samples of the frames under the protocol's data_received."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [f.split(" (")[0] + " (" + f.rsplit("/", 1)[-1] for f in stack.split(";")]
        n = int(count)
        total += n
        if frames:
            own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    print(f"    py-spy: {total} samples; self time (top {top}):")
    for frame, n in own.most_common(top):
        print(f"      {n / total:6.1%}  {frame}")
    print("    inclusive (top 25):")
    for frame, n in inclusive.most_common(25):
        print(f"      {n / total:6.1%}  {frame}")


def measure(src: str | None, arch: str, seconds: float, connections: int, profile: Path | None) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())} if src else None
    stop = threading.Event()
    folder = Path(tempfile.mkdtemp(prefix="refusal-cpu-"))
    # The 200s on a server whose queue holds the load: with the refusal run's bound of 1, most would be 503s.
    with TwinserveServer(MODELS, arch, *SERVED_FLAGS, env=env) as server:
        iris = f"{server.url}/v1/models/iris:predict"
        wrk(iris, IRIS, connections, 2)  # warm-up
        cpu = tree_cpu_seconds(server.pid)
        served = wrk(iris, IRIS, connections, seconds)
        per_200 = (tree_cpu_seconds(server.pid) - cpu) / (served["rps"] * seconds)
        if served["errors"] > 0.01 * served["rps"] * seconds:
            print(f"    note: {served['errors']:,.0f} of the served run's answers were not 200")
    with TwinserveServer(MODELS, arch, *FLAGS, env=env) as server:
        gate = f"{server.url}/v1/models/gate:predict"
        held = _fill(gate, folder, stop)
        try:
            spy = _profile(server.pid, seconds, profile / f"{arch}.txt") if profile else None
            cpu = tree_cpu_seconds(server.pid)
            refused = wrk(gate, PLAIN, connections, seconds)
            answers = refused["rps"] * seconds
            per_refusal = (tree_cpu_seconds(server.pid) - cpu) / answers
            if refused["errors"] < 0.99 * answers:
                print(f"    note: only {refused['errors']:,.0f} of {answers:,.0f} answers were not 200")
            if spy is not None:
                spy.wait(timeout=seconds + 60)
        finally:
            stop.set()
            for n in range(len(held)):
                (folder / f"g{n}.release").touch()
            for thread in held:
                thread.join(timeout=30)
            shutil.rmtree(folder, ignore_errors=True)
    print(
        f"  {arch:<7} 200: {per_200 * 1e6:7,.0f} us CPU ({served['rps']:,.0f}/s)   "
        f"503: {per_refusal * 1e6:6,.0f} us CPU ({refused['rps']:,.0f}/s)   refusal / 200: {per_refusal / per_200:.1%}"
    )
    if profile:
        _summarise(profile / f"{arch}.txt")
    return per_200, per_refusal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", action="append", help="a checkout's src/ folder (repeat to compare)")
    parser.add_argument("--archs", default="sync,async,hybrid")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--profile", type=Path, help="a folder for py-spy's samples of the refusal runs")
    args = parser.parse_args()
    require_wrk()
    if args.profile:
        if shutil.which("py-spy") is None:
            sys.exit("py-spy is not installed (pip install py-spy)")
        args.profile.mkdir(parents=True, exist_ok=True)
    for src in args.src or [None]:
        print(f"{src or 'this checkout'}: {args.connections} connections, {args.seconds:g} s per run (wrk)")
        for arch in args.archs.split(","):
            measure(src, arch, args.seconds, args.connections, args.profile)


if __name__ == "__main__":
    main()
