"""CPU per request of the async or hybrid front, in process: V1 predict on the iris example, no sockets, no load
generator.

The app is built as `twinserve serve --arch async|hybrid` builds it, its lifespan run, and requests are handed to it
as ASGI calls by `--concurrency` closed-loop callers (so batches form as under real load). What is measured is the
CPU time of this process (every thread: the loop, the predict or pipe threads) and, for hybrid, of its model-worker
processes, divided by the requests answered: the front, the codec, the batcher, the pipe and the model together.
To compare two checkouts (before/after a change), name each one's `src/` with `--src`; each runs in its own
subprocess, alternating, and the medians and their ratio are printed.

Each request's scope carries what twinserve's protocol under uvicorn publishes (its `twinserve.disconnect`
extension: the body taken whole, the client's departure polled), so the path measured is the one `twinserve serve`
takes; `--no-extension` measures the path under another ASGI server (a watcher task per request, the body
streamed).

CPU time on a shared 2-core machine varies by 15% or more from run to run, which hides a 5% change.
`--instructions` counts instructions instead (valgrind's callgrind, about 60x slower): each checkout runs at
`--requests` and at six times as many, and the difference over the extra requests is the instructions one
request costs, the same to within about 2% from run to run. Metrics are written as `twinserve serve` writes them
(prometheus-client's multiprocess files). The request log is off unless `--access-log` (serve's default: one JSON
line per request, here written to /dev/null).

    python benchmarks/request_cpu.py [--arch async|hybrid] [--src OLD/src --src NEW/src] [--requests 3000]
        [--rounds 5] [--access-log] [--model tests/models.py:Echo --body '{"instances": [1]}']   # the front's cost
    python benchmarks/request_cpu.py --instructions --requests 640 --src OLD/src --src NEW/src --model ...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import MutableMapping, Sequence
from typing import Any

from cputime import tree_cpu_seconds

BODY = json.dumps(
    {"instances": [{"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}]}
).encode()


async def _measure(
    requests: int, concurrency: int, model: str, body: bytes, arch: str, extension: bool, access_log: bool
) -> float:
    """Microseconds of CPU per answered request, in this process."""
    from twinserve.config import load_config
    from twinserve.core.runtime import load_runtimes
    from twinserve.fronts.asgi import create_asgi_app
    from twinserve.service.contract import Service

    if access_log:  # serve's pipeline, one JSON line per request, written where no one reads it
        from twinserve.observability.logging import configure_logging

        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (the process's life)
        configure_logging("info", "json")
    config = load_config(arch=arch, access_log=access_log, models=[model])
    runtimes = load_runtimes(config)
    name = next(iter(runtimes))
    path = f"/v1/models/{name}:predict"
    app = create_asgi_app(Service(runtimes, config))
    started: asyncio.Queue[MutableMapping[str, Any]] = asyncio.Queue()
    lifespan = asyncio.ensure_future(
        app({"type": "lifespan", "asgi": {"version": "3.0"}}, _lifespan_receive(), started.put)
    )
    assert (await started.get())["type"] == "lifespan.startup.complete"
    never = asyncio.Event()

    async def call() -> int:
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await never.wait()  # the client never leaves
            return {"type": "http.disconnect"}

        status = 0

        async def send(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8000),
        }
        if extension:  # as servers/asgi/protocol.py publishes it: the body arrived whole, the client stays

            def take_body() -> bytes | None:
                nonlocal sent
                if sent:
                    return None
                sent = True
                return body

            scope["extensions"] = {"twinserve.disconnect": {"disconnected": lambda: False, "body": take_body}}
        await app(scope, receive, send)
        return status

    async def caller(count: int) -> None:
        for _ in range(count):
            assert await call() == 200

    await asyncio.gather(*(caller(50) for _ in range(concurrency)))  # warm-up
    stats = runtimes[name].stats
    batches = stats.batches if stats is not None else 0
    cpu = tree_cpu_seconds()
    await asyncio.gather(*(caller(requests // concurrency) for _ in range(concurrency)))
    used = tree_cpu_seconds() - cpu
    answered = requests // concurrency * concurrency
    if stats is not None:  # a model's predict costs per call: CPU per request depends on the batches that formed
        print(f"batch {answered / max(1, stats.batches - batches):.1f}")
    lifespan.cancel()
    return used / answered * 1e6


async def _lifespan_receive_impl(state: dict[str, bool]) -> dict[str, Any]:
    if not state["started"]:
        state["started"] = True
        return {"type": "lifespan.startup"}
    await asyncio.Event().wait()
    return {"type": "lifespan.shutdown"}


def _lifespan_receive() -> Any:
    state = {"started": False}
    return lambda: _lifespan_receive_impl(state)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=["async", "hybrid"], default="async")
    parser.add_argument("--src", action="append", help="a checkout's src/ folder (repeat to compare)")
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", default="twinserve.examples.tabular:Classifier", help="import string")
    parser.add_argument("--body", default=BODY.decode(), help="the request body (JSON)")
    parser.add_argument("--no-extension", action="store_true", help="no twinserve.disconnect in the scope")
    parser.add_argument("--instructions", action="store_true", help="count instructions (valgrind) instead")
    parser.add_argument("--access-log", action="store_true", help="log each request as serve does (to /dev/null)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import uvloop

        body, extension = args.body.encode(), not args.no_extension
        measured = _measure(args.requests, args.concurrency, args.model, body, args.arch, extension, args.access_log)
        print(uvloop.run(measured))
        return
    sources = args.src or [os.path.join(os.path.dirname(__file__), "..", "src")]
    measure = _instructions if args.instructions else _cpu
    unit = "instructions" if args.instructions else "us CPU"
    figures: dict[str, list[float]] = {src: [] for src in sources}
    batches: dict[str, list[str]] = {src: [] for src in sources}
    for _ in range(args.rounds):
        for src in sources:  # alternating, so drift on a noisy machine hits every checkout alike
            figure, batch = measure(args, src)
            figures[src].append(figure)
            batches[src].append(batch)
            print(f"  {src}: {figure:.0f} {unit}, mean batch {batch}", flush=True)
    base = statistics.median(figures[sources[0]])
    for src, values in figures.items():
        median = statistics.median(values)
        shown = ", ".join(f"{v:.0f}" for v in values)
        print(
            f"{src}: median {median:.0f} {unit}/request ({shown}); ratio to the first {median / base:.3f}; "
            f"mean batch sizes {', '.join(batches[src])}"
        )


def _child(args: argparse.Namespace, src: str, requests: int, prefix: Sequence[str] = (), **env: str) -> str:
    command = [*prefix, sys.executable, __file__, "--child", "--arch", args.arch, "--requests", str(requests),
               "--concurrency", str(args.concurrency), "--model", args.model, "--body", args.body]  # fmt: skip
    if args.no_extension:
        command.append("--no-extension")
    if args.access_log:
        command.append("--access-log")
    done = subprocess.run(
        command, env={**os.environ, "PYTHONPATH": os.path.abspath(src), **env}, capture_output=True, text=True
    )
    if done.returncode:
        sys.exit(f"{src}: the measurement failed:\n{done.stdout}{done.stderr}")
    return done.stdout + done.stderr


def _batch(output: str) -> str:
    return next((line.split()[1] for line in output.splitlines() if line.startswith("batch ")), "?")


def _cpu(args: argparse.Namespace, src: str) -> tuple[float, str]:
    output = _child(args, src, args.requests)
    return float(output.strip().splitlines()[-1]), _batch(output)


def _instructions(args: argparse.Namespace, src: str) -> tuple[float, str]:
    """Instructions per request: the count at 6x the requests less the count at 1x, over the extra requests
    (start-up, the model's load and the warm-up cancel out)."""
    counts = []
    answered = [n // args.concurrency * args.concurrency for n in (args.requests, 6 * args.requests)]
    for requests in answered:
        with tempfile.TemporaryDirectory() as metrics_dir:  # multiprocess metrics, as the server writes them
            output = _child(args, src, requests, ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"],
                            PROMETHEUS_MULTIPROC_DIR=metrics_dir)  # fmt: skip
        found = re.search(r"Collected : (\d+)", output)
        if found is None:
            sys.exit(f"no instruction count from valgrind (is it installed?):\n{output[-2000:]}")
        counts.append(int(found.group(1)))
    return (counts[1] - counts[0]) / (answered[1] - answered[0]), _batch(output)


if __name__ == "__main__":
    main()
