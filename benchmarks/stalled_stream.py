"""A predict beside a `:stream` client that stops reading, in hybrid with one model worker; checkouts side by side.

Each checkout (`--src DIR/src`) serves the test model `Drip` (a stream of large steps, endless here) with
`--model-workers 1 --read-timeout-s 30`. One client opens a stream and never reads it (a 4 KiB receive buffer);
once the stream has begun, another client sends `:predict` to the same model (its one worker) and the seconds
until its answer are printed. A server that holds the model worker for the stalled client answers it only after
the write deadline (30 s); one that lets the worker go answers it at once. Run it alone.

    python benchmarks/stalled_stream.py [--src OLD/src --src NEW/src]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import httpx

from twinserve.lab.servers import ServerProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
MODELS = [f"{ROOT / 'tests' / 'models.py'}:Drip"]


def _measure(src: str) -> float:
    port = free_port()
    args = [sys.executable, "-m", "twinserve", "serve", *MODELS, "--arch", "hybrid", "--host", "127.0.0.1"]
    args += ["--port", str(port), "--model-workers", "1", "--read-timeout-s", "30"]
    env = {**os.environ, "PYTHONPATH": f"{os.path.abspath(src)}{os.pathsep}{ROOT}"}
    with tempfile.TemporaryDirectory() as trace, ServerProcess(args, port=port, env=env) as server:
        body = json.dumps({"instances": [{"dir": trace, "tag": "x" * 65_536, "steps": 100_000}]}).encode()
        head = b"POST /v1/models/drip:stream HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        with socket.socket() as stalled:
            stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            stalled.connect(("127.0.0.1", server.port))
            stalled.sendall(head + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)  # never read
            steps = Path(trace) / "steps"
            deadline = time.monotonic() + 30
            while not steps.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            started = time.monotonic()
            beside = {"instances": [{"dir": trace + "/beside", "steps": 2}]}  # the same model: its one worker
            Path(trace, "beside").mkdir()
            answer = httpx.post(f"http://127.0.0.1:{server.port}/v1/models/drip:predict", json=beside, timeout=60)
            waited = time.monotonic() - started
            if answer.status_code != 200:
                sys.exit(f"{src}: the predict was answered {answer.status_code}: {answer.text[:200]}")
            return waited


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", action="append", help="a checkout's src/ folder (repeat to compare)")
    args = parser.parse_args()
    for src in args.src or [str(ROOT / "src")]:
        print(f"{src}: a predict beside a stalled stream answered in {_measure(src):.2f} s", flush=True)


if __name__ == "__main__":
    main()
