"""Would granian, a Rust HTTP server, serve the async architecture faster than uvicorn? (Issue 15, item 2.)

The same ASGI app, built by `twinserve.servers.asgi.server.AppFactory` (the models load in its lifespan; granian, given
an import string, gets `app` here, which reads the Config from `CONFIG_ENV`), under uvicorn as `twinserve serve
--arch async` runs it (uvloop, httptools with twinserve's refusal before the app) and under granian (its Rust HTTP/1
parser, the app on uvloop), the same workers, side by side in alternating rounds: wrk at `--connections` over
keep-alive connections on the built-in examples. Printed per model and workers: median req/s and P99 of the rounds, and
granian / uvicorn. What granian would not give, whatever it measures: the refusal before the app (a 503 for a
full queue without the app's parse, `servers/asgi/crowd.py`) and the WebSocket drain on SIGTERM.

Needs granian (`pip install granian`: not a twinserve dependency) and wrk. Not CI (minutes of load on every
core): run it alone.

    python benchmarks/granian_front.py [--models tabular,minilm] [--workers 1,2] [--seconds 10] [--rounds 2]
                                       [--connections 64]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
from pathlib import Path

from common import Server, require_wrk, warm_wrk
from starlette.types import ASGIApp

from twinserve.config import Config
from twinserve.lab.servers import ServerProcess, free_port
from twinserve.servers.asgi.server import AppFactory
from twinserve.servers.served import Served

#: granian's worker processes import `app` from a string: the Config reaches them in this variable.
CONFIG_ENV = "TWINSERVE_GRANIAN_CONFIG_JSON"
MODELS = {"tabular": "twinserve.examples.tabular:Classifier", "minilm": "twinserve.examples.embed:MiniLM"}


def app() -> ASGIApp:
    """granian's app factory (`--factory`), in each of its workers: the app twinserve's uvicorn server builds."""
    return AppFactory(Served(Config.model_validate_json(os.environ[CONFIG_ENV])))()


def granian(model: str, workers: int) -> ServerProcess:
    """The app `twinserve serve --arch async` would run, under granian instead of uvicorn."""
    port = free_port()
    config = Config(arch="async", models=[model], workers=workers, port=port, log_level="warning")
    command = [sys.executable, "-m", "granian", "--interface", "asgi", "--factory", "--loop", "uvloop"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)]
    return ServerProcess(  # run here, where `python -m` finds this module (and `common`)
        [*command, "granian_front:app"],
        port=port,
        env={CONFIG_ENV: config.model_dump_json()},
        cwd=Path(__file__).parent,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tabular,minilm")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=64)
    args = parser.parse_args()
    require_wrk()
    if importlib.util.find_spec("granian") is None:
        sys.exit("granian is not installed (pip install granian)")
    print(f"{'model':<8} {'workers':>7} {'uvicorn req/s':>13} {'P99':>7} {'granian req/s':>13} {'P99':>7} {'ratio':>6}")
    for name in args.models.split(","):
        for workers in map(int, args.workers.split(",")):
            runs: dict[str, list[dict[str, float]]] = {"uvicorn": [], "granian": []}
            for _ in range(args.rounds):  # alternated, so drift over the run falls on both
                uvicorn = Server([MODELS[name]], "async", "--workers", str(workers))
                runs["uvicorn"].append(warm_wrk(uvicorn, args.seconds, args.connections))
                runs["granian"].append(warm_wrk(granian(MODELS[name], workers), args.seconds, args.connections))
            rps = {k: statistics.median(r["rps"] for r in v) for k, v in runs.items()}
            p99 = {k: statistics.median(r["p99"] for r in v) for k, v in runs.items()}
            errors = sum(r["errors"] for v in runs.values() for r in v)
            print(
                f"{name:<8} {workers:>7} {rps['uvicorn']:>13,.1f} {p99['uvicorn']:>7.1f} {rps['granian']:>13,.1f} "
                f"{p99['granian']:>7.1f} {rps['granian'] / rps['uvicorn']:>6.2f}"
                + (f"  ({errors:.0f} errors)" if errors else ""),
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
