"""NVIDIA perf_analyzer against real twinserve servers, over the V2 REST endpoint with JSON tensors.

The binary is installed (or found) by the same module `scripts/perf-analyzer.sh` and `twinserve bench` use;
when it cannot be, these tests fail: `make test` installs it before running them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.serving import HTTP, ROOT, Server, free_port
from twinserve.lab import perf_analyzer
from twinserve.lab.drivers import DriverError, drive
from twinserve.lab.plan import BenchPlan
from twinserve.lab.results import load_results

TABULAR = "twinserve.examples.tabular:Classifier"
SETOSA = [5.1, 3.5, 1.4, 0.2]


@pytest.fixture(scope="module")
def installation() -> perf_analyzer.Installation:
    return perf_analyzer.install(quiet=True)


def successes(server: Server) -> int:
    stats = HTTP.get(f"{server.url}/v2/models/iris/stats", timeout=30).json()["model_stats"][0]
    count: int = stats["inference_stats"]["success"]["count"]
    return count


def test_input_data_holds_one_row_per_step() -> None:
    request = {
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 4], "data": [*SETOSA, 6.4, 3.2, 4.5, 1.5]}]
    }
    images = {
        "inputs": [
            {"name": "image", "datatype": "UINT8", "shape": [2, 2, 2], "data": list(range(8))},
            {"name": "tag", "datatype": "BYTES", "shape": [2, 1], "data": ["a", "b"]},
            {"name": "scale", "datatype": "FP64", "shape": [2, 1], "data": [2, 0.5]},
        ]
    }
    assert perf_analyzer.input_data([request, images])["data"] == [
        {"input": {"content": SETOSA, "shape": [4]}},
        {"input": {"content": [6.4, 3.2, 4.5, 1.5], "shape": [4]}},
        {
            "image": {"content": [0, 1, 2, 3], "shape": [2, 2]},
            "tag": {"content": ["a"], "shape": [1]},
            "scale": {"content": [2.0], "shape": [1]},
        },
        {
            "image": {"content": [4, 5, 6, 7], "shape": [2, 2]},
            "tag": {"content": ["b"], "shape": [1]},
            "scale": {"content": [0.5], "shape": [1]},
        },
    ]
    # perf_analyzer reads `2` as no float at all: FP data go out as floats, integers stay integers
    steps = perf_analyzer.input_data([images])["data"]
    assert isinstance(steps[0]["scale"]["content"][0], float) and isinstance(steps[0]["image"]["content"][0], int)


@pytest.mark.parametrize(
    ("request_body", "message"),
    [
        ({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]}, "no dimension besides"),
        ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3]}]}, "must be flat and hold"),
        ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [[1, 2]]}]}, "must be flat and hold"),
        (
            {
                "inputs": [
                    {"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]},
                    {"name": "y", "datatype": "FP32", "shape": [2, 1], "data": [1, 2]},
                ]
            },
            "disagree on the batch dimension",
        ),
        ({"inputs": []}, "non-empty 'inputs'"),
    ],
)
def test_input_data_refuses_what_perf_analyzer_cannot_send(request_body: dict[str, object], message: str) -> None:
    with pytest.raises(perf_analyzer.PerfAnalyzerError, match=message):
        perf_analyzer.input_data([request_body])


def test_the_installed_binary_runs(installation: perf_analyzer.Installation) -> None:
    assert perf_analyzer.locate() == installation
    done = installation.run(["--version"], timeout=60)
    assert done.returncode == 0 and "Perf Analyzer Version" in done.stderr


@pytest.mark.parametrize("arch", ["async", "hybrid", "sync"])
def test_perf_analyzer_drives_every_architecture(installation: perf_analyzer.Installation, arch: str) -> None:
    with Server([TABULAR], arch) as server:
        example = perf_analyzer.v2_example(server.url, "iris")
        assert example["inputs"][0]["shape"] == [3, 4]  # the model's three examples, derived by the server
        before = successes(server)
        measured = perf_analyzer.measure(
            installation, server.url, "iris", perf_analyzer.input_data([example]), [1, 4], duration_s=1.5
        )
        answered = successes(server) - before
    assert [level["concurrency"] for level in measured.levels] == [1, 4]
    for level in measured.levels:
        assert level["driver"] == "perf_analyzer" and level["sent"] == level["ok"] > 0
        assert level["throughput_rps"] > 0 and level["duration_s"] > 0
        ms = level["latency_ms"]
        assert 0 < ms["p50"] <= ms["p90"] <= ms["p95"] <= ms["p99"] and ms["mean"] > 0
        # the server's part, which perf_analyzer read from /v2/models/iris/stats
        assert level["server_side_ms"]["server_compute_infer"] > 0
        assert level["server_side_ms"]["server_queue"] >= 0
    assert answered >= sum(level["sent"] for level in measured.levels)  # it counts what the windows held
    summary = perf_analyzer.summary_lines(measured.stdout)
    assert any(line.startswith("Concurrency: 4, throughput: ") and "infer/sec" in line for line in summary)
    assert any(line.startswith("Avg request latency: ") and "queue" in line for line in summary)


@pytest.mark.parametrize("arch", ["async", "hybrid", "sync"])
def test_perf_analyzer_drives_grpc(installation: perf_analyzer.Installation, arch: str) -> None:
    """`perf_analyzer -i grpc` against `--grpc-port`: its metadata, config and statistics calls and raw tensors."""
    grpc_port = free_port()
    with Server([TABULAR], arch, "--grpc-port", str(grpc_port)) as server:
        data = perf_analyzer.input_data([perf_analyzer.v2_example(server.url, "iris")])
        before = successes(server)
        target = f"127.0.0.1:{grpc_port}"
        measured = perf_analyzer.measure(installation, server.url, "iris", data, [2], duration_s=1, grpc_target=target)
        answered = successes(server) - before
    (level,) = measured.levels
    assert level["sent"] == level["ok"] > 0 and level["server_side_ms"]["server_compute_infer"] > 0
    assert answered >= level["sent"]


def test_the_script_measures_a_server(installation: perf_analyzer.Installation) -> None:
    env = {**os.environ, "TWINSERVE_PYTHON": sys.executable}
    script = str(ROOT / "scripts" / "perf-analyzer.sh")
    assert subprocess.run([script, "install"], env=env, capture_output=True, text=True, timeout=300).stdout.strip() == (
        str(installation.binary)
    )
    with Server([TABULAR], "async") as server:
        done = subprocess.run(
            [script, "measure", server.url, "iris", "--concurrency", "2", "--duration", "1", "--warmup", "0.3"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Concurrency: 2, throughput: " in done.stdout
        unknown = subprocess.run(
            [script, "measure", server.url, "nope", "--duration", "1"], env=env, capture_output=True, text=True
        )
        invalid = perf_analyzer.input_data(
            [{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [500, 3.5, 1.4, 0.2]}]}]
        )
        # perf_analyzer stops at the first failed request and says why: the server's own V2 error message
        with pytest.raises(perf_analyzer.PerfAnalyzerError, match=r"less than or equal to 100"):
            perf_analyzer.measure(installation, server.url, "iris", invalid, [1], duration_s=1)
    assert unknown.returncode == 1 and "model 'nope' has no V2 example request" in unknown.stderr


def test_bench_with_the_perf_analyzer_driver(installation: perf_analyzer.Installation, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable, "-m", "twinserve", "bench", TABULAR, "--out", str(out), "--arch", "async",
            "--concurrency", "1,4", "--duration", "1.5", "--warmup", "0.3", "--driver", "perf_analyzer",
            "--ceiling-sizes", "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    results = load_results(out / "results.json")
    [run] = results.runs
    assert run.error is None and [level.concurrency for level in run.levels] == [1, 4]
    for level in run.levels:
        assert level.driver == "perf_analyzer" and level.errors == 0 and level.sent == level.ok > 0
        assert level.throughput_rps > 0 and level.p("p50") is not None
        assert level.server_side_ms["server_compute_infer"] > 0
        assert level.server is not None and level.server.requests >= level.sent  # the server's own /metrics
    assert (out / "report.html").exists()


@pytest.mark.parametrize(("protocol", "driver"), [("grpc", "perf_analyzer"), ("v2", "twinserve")])
def test_bench_protocols(installation: perf_analyzer.Installation, tmp_path: Path, protocol: str, driver: str) -> None:
    """`twinserve bench --protocol grpc` (perf_analyzer over --grpc-port) and `--protocol v2` (V2 /infer JSON)."""
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable, "-m", "twinserve", "bench", TABULAR, "--out", str(out), "--arch", "async",
            "--concurrency", "2", "--duration", "1", "--warmup", "0.2", "--driver", driver,
            "--protocol", protocol, "--ceiling-sizes", "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = load_results(out / "results.json").runs
    assert run.error is None
    assert ("--grpc-port" in run.command) == (protocol == "grpc")  # the server was started with the port
    [level] = run.levels
    assert level.protocol == protocol and level.driver == driver and level.errors == 0 and level.ok > 0
    assert level.server is not None and level.server.requests >= level.ok  # counted by the server as requests


def test_grpc_needs_the_perf_analyzer_driver(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "twinserve", "bench", TABULAR, "--out", str(tmp_path), "--protocol", "grpc"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "--driver perf_analyzer" in done.stderr


def test_the_driver_refuses_a_v1_payload(installation: perf_analyzer.Installation, tmp_path: Path) -> None:
    payload = tmp_path / "bodies.jsonl"
    body = b'{"instances": [{"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}]}'
    payload.write_bytes(body + b"\n")
    plan = BenchPlan(TABULAR, [], tmp_path, concurrency=[1], payload=payload, driver="perf_analyzer")
    url = "http://127.0.0.1:9/v1/models/iris:predict"  # refused before anything is sent
    with pytest.raises(DriverError, match=r"give --payload lines that are V2 inference requests"):
        drive(plan, url, [body], "closed", 1)
