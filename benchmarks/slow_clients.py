"""Health checks beside clients that trickle their bodies, per architecture; checkouts side by side.

Each architecture serves the built-in iris example with its defaults. `TRICKLERS` connections (more than sync's
request threads) each send a predict request's head and then its body one byte every `TRICKLE_EVERY_S` (every other
one chunked), for `SECONDS`; meanwhile `CHECKS` `GET /v2/health/live`, one every `CHECK_EVERY_S`, each given
`CHECK_TIMEOUT_S`. A server that reads bodies in its request threads lets the tricklers hold every thread, and a
health check waits behind them: a Kubernetes liveness probe that times out restarts a healthy pod. Printed per
architecture and checkout: health checks answered 200 in time (of `CHECKS`) and their median latency. Issue #42's
bar: at least 18 of 20 in every architecture. Figures are from this machine and this run; run it alone.

    python benchmarks/slow_clients.py [--src OLD/src --src NEW/src] [--archs sync,async,hybrid]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

from twinserve.lab.servers import ServerProcess, free_port

MODEL = "twinserve.examples.tabular:Classifier"
TRICKLERS = 12
TRICKLE_EVERY_S = 0.5
CHECKS = 20
CHECK_EVERY_S = 0.25
CHECK_TIMEOUT_S = 1.0
BODY = b'{"instances": [{"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}]}'


def _server(src: str | None, arch: str) -> ServerProcess:
    port = free_port()  # an old checkout may not announce the port it bound: give it one
    args = [sys.executable, "-m", "twinserve", "serve", MODEL, "--arch", arch, "--host", "127.0.0.1"]
    env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())} if src else None
    return ServerProcess([*args, "--port", str(port)], port=port, env=env)


def _trickle(port: int, chunked: bool, stop: threading.Event) -> None:
    """One slow client: the head at once, then the body a byte at a time until `stop` (or the server cuts it)."""
    framing = b"Transfer-Encoding: chunked" if chunked else b"Content-Length: %d" % len(BODY)
    head = b"POST /v1/models/iris:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(head + framing + b"\r\n\r\n")
            for byte in BODY:
                if stop.wait(TRICKLE_EVERY_S):
                    return
                sock.sendall(b"1\r\n%c\r\n" % byte if chunked else bytes([byte]))
    except OSError:
        return  # cut off by the server: its read deadline


def measure(src: str | None, arch: str) -> tuple[int, float | None]:
    """Health checks answered 200 within `CHECK_TIMEOUT_S` while the tricklers trickle, and their median ms."""
    with _server(src, arch) as server:
        stop = threading.Event()
        tricklers = [
            threading.Thread(target=_trickle, args=(server.port, i % 2 == 1, stop), daemon=True)
            for i in range(TRICKLERS)
        ]
        for trickler in tricklers:
            trickler.start()
        time.sleep(1.0)  # every trickler's head is in, its body on its way
        latencies: list[float] = []
        with httpx.Client(timeout=CHECK_TIMEOUT_S) as client:
            for _ in range(CHECKS):
                started = time.perf_counter()
                try:
                    ok = client.get(f"{server.url}/v2/health/live").status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    latencies.append((time.perf_counter() - started) * 1000)
                time.sleep(CHECK_EVERY_S)
        stop.set()
        for trickler in tricklers:
            trickler.join(timeout=5)
    return len(latencies), statistics.median(latencies) if latencies else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", action="append", help="a checkout's src/ folder (repeat to compare)")
    parser.add_argument("--archs", default="sync,async,hybrid")
    args = parser.parse_args()
    print(f"{'checkout':<28} {'arch':<7} {'health ok':>10} {'P50 ms':>8}")
    for arch in args.archs.split(","):
        for src in args.src or [None]:
            ok, p50 = measure(src, arch)
            median = "-" if p50 is None else f"{p50:.1f}"
            print(f"{src or 'this checkout':<28} {arch:<7} {f'{ok}/{CHECKS}':>10} {median:>8}")


if __name__ == "__main__":
    main()
