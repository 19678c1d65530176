"""What a WebSocket stream costs next to HTTP: the same async server, the same one-instance message, in one run.

`twinserve serve MODEL --arch async --workers 1`, driven first by wrk (HTTP/1.1 keep-alive, `--connections`
connections) and then by a `websockets` client (`--sockets` sockets, each keeping `--window` messages unanswered,
in a process of its own). Both send the model's first example; prints throughput, P50/P99 and the WS/HTTP ratio.
The WebSocket client is Python (wrk is C): on a small machine its own CPU is part of what is measured.

    python benchmarks/websocket.py [--model twinserve.examples.tabular:Classifier] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import time
from typing import Any

from common import Server, example_request, require_wrk, wrk
from websockets.asyncio.client import connect


async def _stream(url: str, body: dict[str, Any], window: int, until: float, latencies: list[float]) -> int:
    async with connect(url, max_queue=None) as websocket:
        sent_at: dict[str, float] = {}
        answered = sent = 0
        while True:
            now = time.perf_counter()
            while now < until and len(sent_at) < window:
                key = str(sent)
                sent_at[key] = now
                await websocket.send(json.dumps({"id": key, **body}))
                sent += 1
            if not sent_at:
                return answered
            reply = json.loads(await websocket.recv())
            if "predictions" not in reply:
                raise RuntimeError(f"error answer: {reply}")
            latencies.append(time.perf_counter() - sent_at.pop(reply["id"]))
            answered += 1


def _client(url: str, body: dict[str, Any], sockets: int, window: int, seconds: float, out: Any) -> None:
    async def run() -> tuple[int, list[float]]:
        latencies: list[float] = []
        until = time.perf_counter() + seconds
        counts = await asyncio.gather(*(_stream(url, body, window, until, latencies) for _ in range(sockets)))
        return sum(counts), latencies

    started = time.perf_counter()
    answered, latencies = asyncio.run(run())
    elapsed = time.perf_counter() - started
    latencies.sort()
    out.send(
        {
            "rps": answered / elapsed,
            "p50": latencies[len(latencies) // 2] * 1000,
            "p99": latencies[int(len(latencies) * 0.99)] * 1000,
            "errors": 0,
        }
    )


def stream_load(url: str, body: dict[str, Any], sockets: int, window: int, seconds: float) -> dict[str, float]:
    """Messages per second and latency percentiles (ms) over `sockets` sockets, from a process of its own."""
    receiver, sender = multiprocessing.Pipe(duplex=False)
    process = multiprocessing.get_context("spawn").Process(
        target=_client, args=(url, body, sockets, window, seconds, sender)
    )
    process.start()
    result: dict[str, float] = receiver.recv()
    process.join(timeout=60)
    if process.exitcode != 0:
        raise RuntimeError(f"the WebSocket client exited with {process.exitcode}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="twinserve.examples.tabular:Classifier")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--sockets", type=int, default=8)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10)
    args = parser.parse_args()
    require_wrk()
    with Server([args.model], "async", "--workers", "1", "--log-level", "warning") as server:
        url, raw = example_request(server)
        body = json.loads(raw)
        ws_url = url.replace("http://", "ws://").replace(":predict", "/ws")
        wrk(url, raw, 4, 2)  # warm-up
        stream_load(ws_url, body, 2, 2, 2)
        http = wrk(url, raw, args.connections, args.seconds)
        ws = stream_load(ws_url, body, args.sockets, args.window, args.seconds)
    print(f"async, 1 worker, {args.seconds:g} s, one instance per request/message ({args.model})")
    print(f"{'transport':>34} | {'per s':>8} | {'P50 ms':>7} | {'P99 ms':>7}")
    for label, figures in (
        (f"HTTP, wrk {args.connections} connections", http),
        (f"WebSocket, {args.sockets} sockets x window {args.window}", ws),
    ):
        print(f"{label:>34} | {figures['rps']:>8.0f} | {figures['p50']:>7.2f} | {figures['p99']:>7.2f}")
    print(f"WebSocket / HTTP throughput: {ws['rps'] / http['rps']:.2f}")


if __name__ == "__main__":
    main()
