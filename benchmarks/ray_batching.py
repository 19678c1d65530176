"""Batching on Ray Serve: twinserve's engine batcher (what `twinserve ray` runs) vs Ray's own `@serve.batch`.

Same model, replicas, max batch size, load and machine. "engine" is `twinserve ray MODEL --replicas N`: each
replica is twinserve's async front, its batcher feeding predict in a thread. "serve.batch" is the least a Ray
user would write instead: a plain deployment whose `__call__` parses the JSON body and awaits a
`@serve.batch(max_batch_size=B, batch_wait_timeout_s=--max-batch-delay-ms)` method that validates the instances
with the model's pydantic type, runs predict in a thread (as the engine does) and encodes the outputs; no
admission control, deadlines, metrics or logs. Both get the same `max_ongoing_requests`. wrk drives both over
HTTP through Ray's proxy at each connection count, alternating setups `--rounds` times.

The proxy hop, directly: the serve.batch deployment is also driven from a Python driver process through a
`DeploymentHandle` (`handle.infer.remote(instance)`: no HTTP, no proxy; the driver joins the same Ray) with as
many concurrent callers as wrk has connections. Prints req/s, P50/P99 per round, then means and ratios
(serve.batch / engine; HTTP via proxy / handle). Quote ratios, not absolutes: one small shared machine.

    python benchmarks/ray_batching.py [--model twinserve.examples.tabular:Classifier] [--connections 1,16,64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from common import ROOT, example_request, require_wrk, wrk
from ray_vs_serve import RayServer

from twinserve.config import load_config
from twinserve.deploy.ray import replica_capacity
from twinserve.lab.servers import ServerProcess, free_port

APP = "batched"
_FIGURES = "handle figures: "


def _batched_deployment(model: str, replicas: int, max_batch_size: int, wait_s: float) -> Any:
    """The `@serve.batch` deployment: the model's predict behind Ray's batcher, nothing of twinserve's front."""
    from pydantic import TypeAdapter
    from ray import serve
    from starlette.requests import Request

    @serve.deployment(
        name=APP,
        num_replicas=replicas,
        max_ongoing_requests=replica_capacity(load_config(arch="async", models=[model], max_batch_size=max_batch_size)),
        ray_actor_options={"num_cpus": 1},
        logging_config={"enable_access_log": False},
    )
    class BatchedModel:
        def __init__(self) -> None:
            from twinserve.model import ModelSpec, import_model

            instance = import_model(model)()
            instance.config = load_config(arch="async")
            self.spec = ModelSpec(instance)
            if self.spec.load is not None:
                self.spec.load.fn()
            item_in: Any = self.spec.input_type  # the model's own types, known at run time only
            item_out: Any = self.spec.output_type
            self.inputs: TypeAdapter[Any] = TypeAdapter(list[item_in])
            self.outputs: TypeAdapter[Any] = TypeAdapter(list[item_out])
            # serve.batch's wrapper has these setters; its annotations say it is the plain coroutine function
            self.batched.set_max_batch_size(max_batch_size)  # type: ignore[attr-defined]
            self.batched.set_batch_wait_timeout_s(wait_s)  # type: ignore[attr-defined]

        @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.0)
        async def batched(self, instances: list[Any]) -> list[Any]:
            validated = self.inputs.validate_python(instances)
            outputs = await asyncio.to_thread(self.spec.predict.fn, validated)
            encoded: list[Any] = self.outputs.dump_python(outputs, mode="json")
            return encoded

        async def infer(self, instance: Any) -> Any:
            return await self.batched(instance)

        async def __call__(self, request: Request) -> dict[str, Any]:
            if request.method == "GET":
                return {"ready": True}  # the readiness probe the benchmark waits on
            instances = (await request.json())["instances"]
            return {"predictions": list(await asyncio.gather(*(self.batched(i) for i in instances)))}

    return BatchedModel.bind()  # type: ignore[attr-defined]  # serve.deployment made it a Deployment


def serve_batch_app(
    model: str, port: int, replicas: int, max_batch_size: int, wait_s: float, handle_load: str | None = None
) -> None:
    """The serve.batch setup's process: a local Ray serving the deployment on `port` until SIGTERM, or with
    `handle_load` (`instance-json;levels;seconds`) drive it through a DeploymentHandle, print the figures, stop."""
    import ray
    from ray import serve

    stop = threading.Event()
    ray.init(object_store_memory=100 * 1024 * 1024, include_dashboard=False)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, frame: stop.set())
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        handle = serve.run(_batched_deployment(model, replicas, max_batch_size, wait_s), name=APP, route_prefix="/")
        if handle_load is not None:
            instance, levels, seconds = handle_load.split(";")
            figures = asyncio.run(_handle_levels(handle, json.loads(instance), levels, float(seconds)))
            print(_FIGURES + json.dumps(figures), flush=True)
            return
        while not stop.wait(0.5):
            pass
    finally:
        serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()


class ServeBatchServer(ServerProcess):
    """This script's `--serve-batch-app` process on a free port (any GET on it answers 200 once deployed)."""

    def __init__(self, model: str, replicas: int, max_batch_size: int, wait_s: float) -> None:
        port = free_port()
        super().__init__([sys.executable, __file__, "--serve-batch-app", str(port), "--model", model], port=port)
        self.args += ["--replicas", str(replicas), "--max-batch-size", str(max_batch_size)]
        self.args += ["--max-batch-delay-ms", str(wait_s * 1000)]

    def handle_load(self, instance: Any, levels: list[int], seconds: float) -> dict[int, dict[str, float]]:
        """The same deployment in a fresh Ray, driven through a DeploymentHandle by its own process (a driver)."""
        spec = f"{json.dumps(instance)};{','.join(map(str, levels))};{seconds}"
        args = [*self.args[:3], str(free_port()), *self.args[4:], "--handle-load", spec]
        out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=600, cwd=ROOT).stdout
        line = next(line for line in out.splitlines() if line.startswith(_FIGURES))
        return {int(c): r for c, r in json.loads(line.removeprefix(_FIGURES)).items()}


def _percentile(sorted_ms: list[float], q: float) -> float:
    return sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))]


async def _drive_handle(handle: Any, instance: Any, callers: int, seconds: float) -> dict[str, float]:
    latencies: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds

    async def caller() -> None:
        nonlocal errors
        while (start := time.perf_counter()) < stop_at:
            try:
                await handle.infer.remote(instance)
            except Exception:  # counted, like wrk's non-2xx responses
                errors += 1
                continue
            latencies.append((time.perf_counter() - start) * 1000)

    began = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    elapsed = time.perf_counter() - began
    latencies.sort()
    return {
        "rps": len(latencies) / elapsed,
        "p50": _percentile(latencies, 0.50),
        "p99": _percentile(latencies, 0.99),
        "errors": errors,
    }


async def _handle_levels(handle: Any, instance: Any, levels: str, seconds: float) -> dict[int, dict[str, float]]:
    await _drive_handle(handle, instance, 4, 2)  # warm-up
    return {int(c): await _drive_handle(handle, instance, int(c), seconds) for c in levels.split(",")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="twinserve.examples.tabular:Classifier")
    parser.add_argument("--connections", default="1,16,64")
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-batch-delay-ms", type=float, default=0.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--serve-batch-app", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--handle-load", help=argparse.SUPPRESS)
    args = parser.parse_args()
    wait_s = args.max_batch_delay_ms / 1000
    if args.serve_batch_app is not None:
        serve_batch_app(args.model, args.serve_batch_app, args.replicas, args.max_batch_size, wait_s, args.handle_load)
        return
    require_wrk()
    levels = [int(c) for c in args.connections.split(",")]
    engine, batch, handle = "engine (http)", "serve.batch (http)", "serve.batch (handle)"
    runs: dict[str, dict[int, list[dict[str, float]]]] = {k: {c: [] for c in levels} for k in (engine, batch, handle)}
    print(
        f"model {args.model}; {args.replicas} replicas; max batch {args.max_batch_size}, delay "
        f"{args.max_batch_delay_ms:g} ms; wrk/driver on the same machine; {args.rounds} rounds of {args.seconds} s"
    )
    print(f"{'round':>5} | {'conns':>5} | {'setup':>20} | {'req/s':>8} | {'P50 ms':>7} | {'P99 ms':>7} | errors")

    def report(round_: int, label: str, c: int, r: dict[str, float]) -> None:
        runs[label][c].append(r)
        print(
            f"{round_:>5} | {c:>5} | {label:>20} | {r['rps']:>8.0f} | {r['p50']:>7.2f} | {r['p99']:>7.2f} | "
            f"{r['errors']:.0f}",
            flush=True,
        )

    flags = ["--max-batch-size", str(args.max_batch_size), "--max-batch-delay-ms", str(args.max_batch_delay_ms)]
    for round_ in range(1, args.rounds + 1):
        twinserve = RayServer(args.model, str(args.replicas))
        twinserve.args += flags
        with twinserve as server:
            url, body = example_request(server)
            path = url.removeprefix(server.url)
            wrk(url, body, 4, 2)  # warm-up
            for c in levels:
                report(round_, engine, c, wrk(url, body, c, args.seconds))
        with ServeBatchServer(args.model, args.replicas, args.max_batch_size, wait_s) as batched:
            url = batched.url + path
            wrk(url, body, 4, 2)
            for c in levels:
                report(round_, batch, c, wrk(url, body, c, args.seconds))
        instance = json.loads(body)["instances"][0]
        for c, r in batched.handle_load(instance, levels, args.seconds).items():
            report(round_, handle, c, r)

    print(f"\nmean of {args.rounds} rounds")
    print(
        f"{'conns':>5} | {'setup':>20} | {'req/s':>8} | {'P50 ms':>7} | {'P99 ms':>7} | vs {'':>18} | req/s x | P99 x"
    )
    for c in levels:
        mean = {k: {m: statistics.fmean(r[m] for r in runs[k][c]) for m in ("rps", "p50", "p99")} for k in runs}
        for label, base in ((engine, engine), (batch, engine), (handle, batch)):
            m, b = mean[label], mean[base]
            print(
                f"{c:>5} | {label:>20} | {m['rps']:>8.0f} | {m['p50']:>7.2f} | {m['p99']:>7.2f} | vs {base:>18} | "
                f"{m['rps'] / b['rps']:>7.2f} | {m['p99'] / b['p99']:>5.2f}"
            )
    hop = statistics.fmean(r["p50"] for r in runs[batch][levels[0]])
    hop -= statistics.fmean(r["p50"] for r in runs[handle][levels[0]])
    print(f"\nHTTP through Ray's proxy vs a DeploymentHandle at {levels[0]} caller(s): {hop:+.2f} ms on P50")


if __name__ == "__main__":
    main()
