"""Where one request's CPU goes, per architecture: py-spy samples of the whole server process tree, in buckets.

Each architecture serves the built-in iris example (a random forest) and is driven at `--concurrency` closed-loop
connections by twinserve's load generator while `py-spy record` samples every process of the server (gunicorn's or
uvicorn's workers, hybrid's model workers) for `--seconds`. Each sample is put in the bucket of the first frame,
from the innermost outwards, whose file matches one (model code and numerical libraries, JSON codecs, validation,
metrics, logging, batching and thread hand-offs, twinserve's front, the HTTP server, the event loop). Shares are
of the samples taken while on CPU (py-spy leaves idle threads out), so they hold on a busy machine better than
throughput does; still, run it alone. `--flame DIR` also writes one flame graph (SVG) per architecture.

    python benchmarks/profile_request.py [--archs sync,async,hybrid] [--seconds 8] [--concurrency 16] [--flame DIR]
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from twinserve.lab.loadgen import LoadSpec, run_level_sync
from twinserve.lab.servers import TwinserveServer

MODEL = "twinserve.examples.tabular:Classifier"
BODY = b'{"instances": [{"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}]}'

#: (bucket, substrings of a frame's "function (file:line)"), tried in order for each frame from the innermost out.
BUCKETS: list[tuple[str, tuple[str, ...]]] = [
    ("model + numerical libraries", ("sklearn/", "numpy/", "scipy/", "joblib/", "examples/tabular.py")),
    ("JSON decode / encode", ("orjson", "twinserve/encoding.py", "twinserve/protocol/", "json/")),
    ("validation (pydantic)", ("pydantic",)),
    ("metrics (prometheus-client)", ("prometheus_client/", "twinserve/observability/metrics.py")),
    ("logging (structlog, logging)", ("structlog/", "logging/", "twinserve/observability/logging.py")),
    ("context vars, tracing", ("twinserve/observability/context.py", "twinserve/observability/tracing.py")),
    (
        "batcher, executors, thread hand-offs",
        (
            "twinserve/core/",
            "concurrent/futures/",
            "threading.py",
            "queue.py",
            "multiprocessing/",
            "selectors.py",
        ),
    ),
    ("twinserve front (exchange, routes, admission)", ("twinserve/fronts/", "twinserve/service/")),
    ("HTTP server (uvicorn, httptools, gunicorn)", ("uvicorn/", "httptools", "gunicorn/", "twinserve/servers/")),
    ("event loop", ("asyncio/", "uvloop")),
]
OTHER = "other"


#: Innermost frames that are a thread blocked in a system call which py-spy's idle heuristic still counts: a
#: thread pool's idle worker in `queue.get`, a selector's poll, a pipe read.
WAITS = ("select (", "_worker (concurrent/futures/thread.py", "Connection._recv (", "wait (threading.py")
WAITING = "blocked (select, idle pool thread, pipe read)"


def bucket_of(stack: list[str]) -> str:
    if stack and any(stack[-1].startswith(wait) or f" {wait}" in stack[-1] for wait in WAITS):
        return WAITING
    for frame in reversed(stack):
        for name, needles in BUCKETS:
            if any(needle in frame for needle in needles):
                return name
    return OTHER


def shares(raw: Path) -> tuple[int, dict[str, float]]:
    """Samples on CPU, and each bucket's share of them, from py-spy's `--format raw` (collapsed stacks); samples of
    a blocked thread (`WAITS`) are left out."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rstrip().rpartition(" ")
        if stack and n.isdigit():
            counts[bucket_of(stack.split(";"))] += int(n)
    total = sum(counts.values())
    busy = total - counts[WAITING]
    return busy, {name: counts[name] / busy for name in [*(b for b, _ in BUCKETS), OTHER] if busy}


def record(pid: int, seconds: float, out: Path, fmt: str) -> subprocess.Popen[bytes]:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    args = [py_spy, "record", "--pid", str(pid), "--subprocesses", "--duration", str(round(seconds))]
    args += ["--rate", "200", "--nonblocking", "--format", fmt, "-o", str(out)]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def profile(arch: str, seconds: float, concurrency: int, flame: Path | None) -> tuple[float, int, dict[str, float]]:
    with TwinserveServer([MODEL], arch) as server, tempfile.TemporaryDirectory() as tmp:
        url = f"{server.url}/v1/models/iris:predict"
        run_level_sync(LoadSpec(url=url, bodies=[BODY], duration_s=2.0, concurrency=4))  # warm-up
        raw = Path(tmp) / "raw.txt"
        spies = [record(server.pid, seconds, raw, "raw")]
        if flame is not None:
            spies.append(record(server.pid, seconds, flame / f"{arch}.svg", "flamegraph"))
        load = run_level_sync(LoadSpec(url=url, bodies=[BODY], duration_s=seconds + 1, concurrency=concurrency))
        for spy in spies:
            spy.wait(timeout=seconds + 60)
        total, split = shares(raw)
        return load.ok / load.duration_s, total, split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archs", default="sync,async,hybrid")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--flame", type=Path, help="write a flame graph per architecture into this folder")
    args = parser.parse_args()
    if args.flame is not None:
        args.flame.mkdir(parents=True, exist_ok=True)
    results = {arch: profile(arch, args.seconds, args.concurrency, args.flame) for arch in args.archs.split(",")}
    archs = list(results)
    print(f"\n{'bucket':<46}" + "".join(f"{a:>10}" for a in archs))
    for name in [*(b for b, _ in BUCKETS), OTHER]:
        print(f"{name:<46}" + "".join(f"{results[a][2].get(name, 0.0):>10.1%}" for a in archs))
    print(f"{'samples on CPU':<46}" + "".join(f"{results[a][1]:>10}" for a in archs))
    print(f"{'req/s while sampled':<46}" + "".join(f"{results[a][0]:>10,.0f}" for a in archs))


if __name__ == "__main__":
    main()
