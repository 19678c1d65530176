"""What a streamed step costs in each architecture: the built-in `tokens` model, steps/s and time to first step.

For each architecture, `twinserve serve twinserve.examples.tokens:Tokens` (1 worker); one client reads
`--repeats` streams of `--steps` steps one after another (steps/s of one stream, median time to first step),
then `--clients` clients read streams at once (steps/s in all). The model's own work per step is a list index,
so the figures are the serving cost of a step: framing, writing, and, in hybrid, one pipe round trip to the model
worker. `:predict` on the same prompt (all steps collected, one response) is the no-streaming baseline.

    python benchmarks/streaming.py [--steps 1024 --repeats 5 --clients 8]
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from common import Server

ARCHS = ("sync", "async", "hybrid")
MODEL = "twinserve.examples.tokens:Tokens"


def one_stream(client: httpx.Client, url: str, body: dict[str, object], steps: int) -> tuple[float, float]:
    """(seconds to the first step, seconds in all) for one stream read to its `end` event."""
    start = time.perf_counter()
    first, seen = 0.0, 0
    with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith('data: {"predictions"'):
                seen += 1
                if seen == 1:
                    first = time.perf_counter() - start
            elif line == "event: end":
                break
    if seen != steps:
        raise RuntimeError(f"expected {steps} steps, got {seen}")
    return first, time.perf_counter() - start


def measure(arch: str, steps: int, repeats: int, clients: int) -> dict[str, float]:
    body: dict[str, object] = {"instances": [{"text": "benchmark", "max_tokens": steps}]}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    with (
        Server([MODEL], arch, "--workers", "1", "--threads", str(clients + 2)) as server,
        httpx.Client(timeout=120, limits=limits) as client,  # keep-alive: the server's cost, not the client's
    ):
        url = f"{server.url}/v1/models/tokens:stream"
        one_stream(client, url, body, steps)  # warm-up
        runs = [one_stream(client, url, body, steps) for _ in range(repeats)]
        with ThreadPoolExecutor(clients) as pool:
            start = time.perf_counter()
            list(pool.map(lambda _: one_stream(client, url, body, steps), range(clients * 2)))
            concurrent = clients * 2 * steps / (time.perf_counter() - start)
        predict_url = f"{server.url}/v1/models/tokens:predict"
        start = time.perf_counter()
        for _ in range(repeats):
            client.post(predict_url, json=body).raise_for_status()
        collected = (time.perf_counter() - start) / repeats
    return {
        "first_ms": statistics.median(first for first, _ in runs) * 1000,
        "steps_per_s": steps / statistics.median(total for _, total in runs),
        "concurrent_steps_per_s": concurrent,
        "predict_ms": collected * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    results = {arch: measure(arch, args.steps, args.repeats, args.clients) for arch in ARCHS}
    base = results["sync"]
    print(f"tokens model, {args.steps} steps per stream, 1 server worker; ratios against sync")
    clients = f"steps/s ({args.clients} clients)"
    print(f"{'arch':>7} | {'1st step ms':>11} | {'steps/s (1 stream)':>18} | {clients:>20} | {':predict ms':>11}")
    for arch, r in results.items():
        single, many = r["steps_per_s"], r["concurrent_steps_per_s"]
        print(
            f"{arch:>7} | {r['first_ms']:>11.2f} | {single:>9.0f} ({single / base['steps_per_s']:.2f}x)"
            f" | {many:>11.0f} ({many / base['concurrent_steps_per_s']:.2f}x) | {r['predict_ms']:>11.2f}"
        )


if __name__ == "__main__":
    main()
