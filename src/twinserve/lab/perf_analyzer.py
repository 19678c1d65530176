"""NVIDIA perf_analyzer against twinserve's Open Inference Protocol (V2) endpoint: installed, run and read here.

The binary and the `libcudart.so.12` it links are unpacked from pinned PyPI wheels (downloaded, never installed:
the venv's own tritonclient is newer and conflicts, and newer binaries need a newer glibc) into a tools folder
(`$TWINSERVE_TOOLS_DIR`, else `<venv>/tools`, else the XDG cache); `libb64` comes from `scripts/system-deps.sh`.

    python -m twinserve.lab.perf_analyzer install            # idempotent; prints the binary's path
    python -m twinserve.lab.perf_analyzer measure URL MODEL --concurrency 1,8 --duration 5
    python -m twinserve.lab.perf_analyzer -- -m iris -u 127.0.0.1:8000 ...   # any perf_analyzer arguments
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

__all__ = [
    "CUDA_RUNTIME_VERSION",
    "TRITONCLIENT_VERSION",
    "Installation",
    "Measured",
    "PerfAnalyzerError",
    "input_data",
    "install",
    "locate",
    "measure",
    "parse_report",
    "summary_lines",
    "tools_dir",
    "v2_example",
]

TRITONCLIENT_VERSION = "2.50.0"
CUDA_RUNTIME_VERSION = "12.9.79"
_BINARY_MEMBER = f"tritonclient-{TRITONCLIENT_VERSION}.data/data/bin/perf_analyzer"
_CUDART_MEMBER = "nvidia/cuda_runtime/lib/libcudart.so.12"
#: perf_analyzer's CSV columns of mean per-request time (microseconds), under the names `Level` keeps them by.
_COMPONENTS = {
    "Client Send": "client_send",
    "Network+Server Send/Recv": "network_server_send_recv",
    "Server Queue": "server_queue",
    "Server Compute Input": "server_compute_input",
    "Server Compute Infer": "server_compute_infer",
    "Server Compute Output": "server_compute_output",
    "Client Recv": "client_recv",
}


class PerfAnalyzerError(RuntimeError):
    """perf_analyzer could not be installed, or it failed (its own message is in the text)."""


def tools_dir() -> Path:
    override = os.environ.get("TWINSERVE_TOOLS_DIR")
    if override:
        return Path(override)
    if sys.prefix != sys.base_prefix:
        return Path(sys.prefix) / "tools"
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "twinserve" / "tools"


@dataclass(frozen=True)
class Installation:
    """An unpacked perf_analyzer and the folder holding the libraries it loads."""

    binary: Path
    libraries: Path

    def env(self) -> dict[str, str]:
        paths = [str(self.libraries), *filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(":"))]
        return {**os.environ, "LD_LIBRARY_PATH": ":".join(paths)}

    def run(self, args: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                [str(self.binary), *args],
                env=self.env(),
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise PerfAnalyzerError(f"perf_analyzer did not finish within {timeout:.0f} s") from None

    def check(self) -> None:
        """Raise unless the binary starts (a missing shared library is the usual failure)."""
        done = self.run(["--version"], timeout=60)
        if "Perf Analyzer Version" not in done.stdout + done.stderr:
            hint = " (Debian: apt-get install libb64-0d)" if "libb64" in done.stderr else ""
            raise PerfAnalyzerError(f"{self.binary} does not start: {done.stderr.strip()}{hint}")


def _home() -> Path:
    return tools_dir() / f"perf_analyzer-{TRITONCLIENT_VERSION}-cudart-{CUDA_RUNTIME_VERSION}"


def locate() -> Installation | None:
    """The installed perf_analyzer, or None."""
    home = _home()
    found = Installation(home / "perf_analyzer", home)
    if found.binary.is_file() and (home / "libcudart.so.12").is_file():
        return found
    return None


def install(quiet: bool = False) -> Installation:
    """The installed perf_analyzer, downloading the two pinned wheels with pip first if it is missing."""
    found = locate()
    if found is None:
        home = _home()
        home.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="perf-analyzer-", dir=home.parent) as tmp:
            wheels, staged = Path(tmp) / "wheels", Path(tmp) / "staged"
            pins = [f"tritonclient=={TRITONCLIENT_VERSION}", f"nvidia-cuda-runtime-cu12=={CUDA_RUNTIME_VERSION}"]
            download = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(wheels)]
            done = subprocess.run([*download, "-q", *pins], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise PerfAnalyzerError(f"pip download {' '.join(pins)} failed: {done.stderr.strip()}")
            if not quiet:
                print(f"downloaded {' and '.join(pins)}; unpacking into {home}", file=sys.stderr)
            staged.mkdir()
            _unpack(wheels, "tritonclient-", _BINARY_MEMBER, staged / "perf_analyzer")
            _unpack(wheels, "nvidia_cuda_runtime_cu12-", _CUDART_MEMBER, staged / "libcudart.so.12")
            (staged / "perf_analyzer").chmod(0o755)
            try:
                staged.rename(home)  # whole or not at all, even when two installs race
            except OSError:
                if locate() is None:
                    raise
        found = locate()
        assert found is not None
    found.check()
    return found


def _unpack(wheels: Path, prefix: str, member: str, target: Path) -> None:
    wheel = next(iter(sorted(wheels.glob(prefix + "*.whl"))), None)
    if wheel is None:
        raise PerfAnalyzerError(f"pip downloaded no {prefix}*.whl into {wheels}")
    with zipfile.ZipFile(wheel) as archive:
        try:
            source = archive.open(member)
        except KeyError:
            raise PerfAnalyzerError(f"{wheel.name} has no {member} (is this an x86-64 Linux machine?)") from None
        with source, target.open("wb") as out:
            shutil.copyfileobj(source, out)


# -- input data ------------------------------------------------------------------------------------------------
def v2_example(base_url: str, model: str) -> dict[str, Any]:
    """The V2 inference request the server derives from the model's examples() (its OpenAPI example body)."""
    with httpx.Client(timeout=30) as client:
        response = client.get(f"{base_url}/openapi.json")
    if response.is_error:  # e.g. 401: a server with API keys keeps its schema private unless --public-docs
        raise PerfAnalyzerError(f"GET {base_url}/openapi.json answered {response.status_code}: {response.text[:200]}")
    document = response.json()
    operation = document.get("paths", {}).get(f"/v2/models/{model}/infer", {}).get("post", {})
    example = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("example")
    if not isinstance(example, dict):
        raise PerfAnalyzerError(
            f"model {model!r} has no V2 example request: give it examples() whose instances its input tensors "
            "can be built from, or V2 inference requests as the payload"
        )
    return example


def input_data(requests: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """perf_analyzer's `--input-data` JSON: one step per row of the V2 requests' batch dimension.

    perf_analyzer adds the batch dimension itself (the model configuration's max_batch_size is never 0), so each
    step holds one row: its flat row-major content and its shape without the batch dimension.
    """
    steps: list[dict[str, Any]] = []
    for request in requests:
        inputs = request.get("inputs")
        if not isinstance(inputs, list) or not inputs:
            raise PerfAnalyzerError("a V2 inference request needs a non-empty 'inputs' list")
        split: dict[str, list[dict[str, Any]]] = {}
        for tensor in inputs:
            name, shape, data = tensor.get("name"), tensor.get("shape"), tensor.get("data")
            if not isinstance(name, str) or not isinstance(shape, list) or not shape or not isinstance(data, list):
                raise PerfAnalyzerError(f"input {name!r}: perf_analyzer needs JSON 'data' and a batched 'shape'")
            if len(shape) == 1:
                # perf_analyzer drops the batch dimension from the model's metadata shape and refuses the empty
                # shape left ("unable to set shape for the input"); --shape only fills -1 dimensions.
                raise PerfAnalyzerError(
                    f"input {name!r} has no dimension besides the batch one (V2 shape [-1]), which perf_analyzer "
                    "cannot send to a model that batches: declare it with one more, e.g. [-1, 1], or use another "
                    "driver"
                )
            size = math.prod(shape[1:])
            if len(data) != shape[0] * size or any(isinstance(v, list | dict) for v in data):
                raise PerfAnalyzerError(f"input {name!r}: 'data' must be flat and hold {shape} elements")
            data = _typed(tensor.get("datatype"), data)
            split[name] = [{"content": data[i * size : (i + 1) * size], "shape": shape[1:]} for i in range(shape[0])]
        rows = {len(parts) for parts in split.values()}
        if len(rows) != 1:
            raise PerfAnalyzerError(f"the inputs disagree on the batch dimension: {sorted(rows)}")
        steps += [{name: parts[i] for name, parts in split.items()} for i in range(rows.pop())]
    return {"data": steps}


def _typed(datatype: Any, data: list[Any]) -> list[Any]:
    """Integers as floats for FP tensors: perf_analyzer refuses `5` there ("unable to find float data in json")."""
    if datatype not in ("FP16", "FP32", "FP64"):
        return data
    return [float(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in data]


# -- runs and their report -------------------------------------------------------------------------------------
def parse_report(report_csv: str, stdout: str) -> list[dict[str, Any]]:
    """perf_analyzer's `-f` CSV (and the request counts its stdout gives per level) -> `Level` fields, each level.

    perf_analyzer stops at the first failed request, so a report it wrote counts no errors.
    """
    counts = {
        int(level): int(count)
        for level, count in re.findall(r"Request concurrency: (\d+)\s+Client:\s+Request count: (\d+)", stdout)
    }
    levels = []
    for row in csv.DictReader(io.StringIO(report_csv)):
        concurrency, throughput = int(row["Concurrency"]), float(row["Inferences/Second"])
        if concurrency not in counts:
            raise PerfAnalyzerError(f"perf_analyzer printed no request count for concurrency {concurrency}")
        sent = counts[concurrency]
        ms = {p: float(row[f"{p} latency"]) / 1000 for p in ("p50", "p90", "p95", "p99")}
        levels.append(
            {
                "driver": "perf_analyzer",
                "mode": "closed",
                "concurrency": concurrency,
                "duration_s": round(sent / throughput, 3) if throughput else 0.0,
                "sent": sent,
                "ok": sent,
                "throughput_rps": round(throughput, 1),
                "latency_ms": {**ms, "p999": None, "max": None, "mean": float(row["Avg latency"]) / 1000},
                "connections_used": concurrency,
                "server_side_ms": {name: float(row[column]) / 1000 for column, name in _COMPONENTS.items()},
            }
        )
    return levels


@dataclass(frozen=True)
class Measured:
    """`Level` fields for each concurrency, and what perf_analyzer printed."""

    levels: list[dict[str, Any]]
    stdout: str


def measure(
    installation: Installation,
    url: str,
    model: str,
    data: dict[str, Any],
    concurrency: Sequence[int],
    duration_s: float,
    warmup_s: float = 0.0,
    grpc_target: str | None = None,
) -> Measured:
    """Closed-loop levels (perf_analyzer's sync mode: one thread per outstanding request) over JSON tensors, or
    over gRPC (`-i grpc`, raw tensor contents) to `grpc_target` (`host:port`, the server's `--grpc-port`).

    Each level is three windows of `duration_s / 3` and perf_analyzer reports their mean: stability is not
    awaited (so the run is bounded), as the other drivers measure a fixed time. `warmup_s` runs first, unmeasured.
    """
    host = url.removeprefix("http://").rstrip("/")
    # The tensor formats are HTTP's choice (JSON or binary); gRPC always carries raw contents.
    protocol = ["-u", grpc_target, "-i", "grpc"] if grpc_target is not None else [
        "-u", host, "-i", "http", "--input-tensor-format=json", "--output-tensor-format=json",
    ]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="twinserve-perf-analyzer-") as tmp:
        data_file, report = Path(tmp) / "input-data.json", Path(tmp) / "report.csv"
        data_file.write_bytes(orjson.dumps(data))

        def run(level: int, seconds: float, report_file: Path | None) -> str:
            window_ms = max(100, round(seconds * 1000 / 3))
            args = [
                "-m", model, *protocol,
                "--input-data", str(data_file),
                "--measurement-mode", "time_windows", "-p", str(window_ms),
                "--stability-percentage", "1000000", "--max-trials", "3",
                f"--concurrency-range={level}:{level}",
            ]  # fmt: skip
            if report_file is not None:
                args += ["-f", str(report_file), "--verbose-csv"]
            done = installation.run(args, timeout=3 * window_ms / 1000 + 60)
            if done.returncode != 0:
                lines = (done.stdout + done.stderr).strip().splitlines()
                raise PerfAnalyzerError("perf_analyzer failed: " + " / ".join(lines[-4:]))
            return done.stdout

        if warmup_s > 0:
            run(concurrency[0], warmup_s, None)
        stdout = ""
        levels: list[dict[str, Any]] = []
        for level in concurrency:  # one run each: perf_analyzer's ranges are arithmetic, a bench's levels not
            report.unlink(missing_ok=True)
            out = run(level, duration_s, report)
            stdout += out
            if not report.exists():
                raise PerfAnalyzerError(f"perf_analyzer wrote no report: {out.strip()[-500:]}")
            levels += parse_report(report.read_text(), out)
    return Measured(levels, stdout)


def summary_lines(stdout: str) -> list[str]:
    """perf_analyzer's own summary lines ("Concurrency: N, throughput: X infer/sec, latency Y usec") and the
    server-side breakdown it read from the statistics extension."""
    keep = ("Concurrency:", "Request concurrency:", "Avg request latency:")
    return [line.strip() for line in stdout.splitlines() if line.strip().startswith(keep)]


def _levels(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return levels


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:  # perf_analyzer itself, with its libraries found
        installation = install(quiet=True)
        os.execve(installation.binary, [str(installation.binary), *argv[1:]], installation.env())
    parser = argparse.ArgumentParser(prog="python -m twinserve.lab.perf_analyzer", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("install", help="download and unpack perf_analyzer if missing; print its path")
    run = commands.add_parser("measure", help="drive a twinserve server's V2 infer with the model's examples")
    run.add_argument("url", help="the server, e.g. http://127.0.0.1:8000")
    run.add_argument("model", help="the served model's name, e.g. iris")
    run.add_argument("--concurrency", type=_levels, default=[1, 8], help="default 1,8")
    run.add_argument("--duration", type=float, default=5.0, metavar="SECONDS", help="measured seconds per level")
    run.add_argument("--warmup", type=float, default=1.0, metavar="SECONDS")
    run.add_argument(
        "--grpc", metavar="HOST:PORT", help="drive the server's gRPC service (--grpc-port) instead of HTTP"
    )
    args = parser.parse_args(argv)
    try:
        installation = install(quiet=args.command == "measure")
        if args.command == "install":
            print(installation.binary)
            return 0
        url = args.url.rstrip("/")
        data = input_data([v2_example(url, args.model)])
        measured = measure(
            installation, url, args.model, data, args.concurrency, args.duration, args.warmup, grpc_target=args.grpc
        )
    except (PerfAnalyzerError, httpx.HTTPError) as exc:
        print(f"perf_analyzer: error: {exc}", file=sys.stderr)
        return 1
    print(measured.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
