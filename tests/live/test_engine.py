"""The serving engine on real servers: batching, admission (503/504), and model-worker replacement."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ARCHS
from tests.errors import error_fields
from tests.serving import HTTP, Server, model_path, predict, read_response, sample, scrape, wait_for_file

#: Sync batches across the request threads of one process, so give it one process with enough threads.
SAME_PROCESS = {
    "sync": ["--workers", "1", "--threads", "40"],
    "async": ["--workers", "1"],
    "hybrid": ["--workers", "1"],
}


# Servers shared by a module's tests that need the same flags (one start per architecture, not one per test);
# each test leaves its server idle, and counts what it checks from where it started.
@pytest.fixture(scope="module", params=ARCHS)
def batching_server(request: pytest.FixtureRequest) -> Iterator[Server]:
    """BatchRecorder, batches of up to 32 formed within 5 ms, one process and (hybrid) one model worker."""
    flags = ["--max-batch-size", "32", "--max-batch-delay-ms", "5", "--model-workers", "1"]
    with Server([model_path("BatchRecorder")], request.param, *flags, *SAME_PROCESS[request.param]) as server:
        yield server


@pytest.fixture(scope="module", params=ARCHS)
def gate_server(request: pytest.FixtureRequest) -> Iterator[Server]:
    """Gate, batches of 2, a queue of 2, one model worker: a request held in predict fills it with two more."""
    flags = ["--max-batch-size", "2", "--max-queue", "2", "--model-workers", "1", "--read-timeout-s", "30"]
    with Server([model_path("Gate")], request.param, *flags, *SAME_PROCESS[request.param]) as server:
        yield server


def _rejected(server: Server, reason: str) -> float:
    return sample(scrape(server), "twinserve_rejected_requests_total", model="gate", reason=reason)


def test_concurrent_requests_are_batched_and_answered_individually(batching_server: Server) -> None:
    server = batching_server

    def client(i: int) -> list[dict[str, Any]]:
        answers = []
        with httpx.Client(base_url=server.url, timeout=30) as http:  # keep-alive, like a real client
            for k in range(5):
                response = http.post("/v1/models/batchrecorder:predict", json={"instances": [f"{i}-{k}"]})
                assert response.status_code == 200, response.text
                answers.extend(response.json()["predictions"])
        return answers

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        results = list(pool.map(client, range(32)))
    for i, answers in enumerate(results):
        assert [a["input"] for a in answers] == [f"{i}-{k}" for k in range(5)]
    sizes = {a["call"]: a["size"] for answers in results for a in answers}
    assert sum(sizes.values()) == 32 * 5  # every instance computed once, whatever the batches were


def test_requests_queued_behind_a_busy_model_are_computed_as_one_batch(batching_server: Server, tmp_path: Path) -> None:
    """Batching, shown without timing: the one model worker is held inside predict (a gate), 31 single-instance
    requests queue behind it, and once it is released they are computed in one call, each answered with its own."""
    gate = tmp_path / "gate"
    server = batching_server
    url = f"{server.url}/v1/models/batchrecorder:predict"

    def ask(instance: Any) -> dict[str, Any]:
        response = HTTP.post(url, json={"instances": [instance]}, timeout=60)
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()["predictions"][0]
        return answer

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        held = pool.submit(ask, {"gate": str(gate)})
        wait_for_file(gate.with_suffix(".started"))
        queued = [pool.submit(ask, f"q{i}") for i in range(31)]
        wait_for_queue(server, "batchrecorder", 31)
        gate.with_suffix(".release").touch()
        answers = [future.result() for future in queued]
        assert held.result()["size"] == 1
    assert [a["input"] for a in answers] == [f"q{i}" for i in range(31)]
    assert {a["call"] for a in answers} == {answers[0]["call"]} and answers[0]["size"] == 31


def wait_for_queue(server: Server, model: str, instances: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        serving = HTTP.get(f"{server.url}/v1/models/{model}").json()["serving"]
        if serving["queued_instances"] == instances:
            return
        assert time.monotonic() < deadline, f"queue never reached {instances}: {serving}"
        time.sleep(0.01)


def _gate(tmp_path: Path, name: str) -> dict[str, str]:
    return {"gate": str(tmp_path / name)}


def _release(tmp_path: Path, name: str) -> None:
    (tmp_path / f"{name}.release").touch()


def test_full_queue_is_503_with_retry_after(gate_server: Server, tmp_path: Path) -> None:
    server, refused_before = gate_server, _rejected(gate_server, "queue_full")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        busy = pool.submit(predict, server, "gate", [_gate(tmp_path, "busy")])
        wait_for_file(tmp_path / "busy.started")  # the only model worker is now held inside predict
        queued = [pool.submit(predict, server, "gate", [_gate(tmp_path, f"q{i}")]) for i in range(2)]
        wait_for_queue(server, "gate", 2)
        rejected = predict(server, "gate", [_gate(tmp_path, "extra")])
        assert rejected.status_code == 503, rejected.text
        assert rejected.headers["retry-after"] == "1"
        assert error_fields(rejected.json())["code"] == "queue_full"
        for name in ("busy", "q0", "q1"):
            _release(tmp_path, name)
        assert busy.result(timeout=30).status_code == 200
        assert [q.result(timeout=30).status_code for q in queued] == [200, 200]
        assert not (tmp_path / "extra.started").exists()  # a rejected request never reaches the model
        assert _rejected(server, "queue_full") == refused_before + 1


def test_a_full_queue_refuses_from_the_head_before_reading_the_body(gate_server: Server, tmp_path: Path) -> None:
    """While the queue cannot take one more instance, a request is refused from its head alone: a client that
    declares a body and never sends it still gets 503 `queue_full` at once (not 408 at the read timeout)."""
    server = gate_server
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        busy = pool.submit(predict, server, "gate", [_gate(tmp_path, "busy")])
        wait_for_file(tmp_path / "busy.started")
        queued = [pool.submit(predict, server, "gate", [_gate(tmp_path, f"q{i}")]) for i in range(2)]
        wait_for_queue(server, "gate", 2)
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=20) as sock:
            head = (
                "POST /v1/models/gate:predict HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
            )
            sock.sendall(head.encode())  # ... and no body
            answer = read_response(sock).decode("latin-1")
        assert answer.startswith("HTTP/1.1 503"), answer
        assert '"code":"queue_full"' in answer.replace(" ", ""), answer
        for name in ("busy", "q0", "q1"):
            _release(tmp_path, name)
        assert busy.result(timeout=30).status_code == 200
        assert [q.result(timeout=30).status_code for q in queued] == [200, 200]


@pytest.mark.parametrize("arch", ARCHS)
def test_deadline_is_504_and_expired_requests_are_not_computed(arch: str, tmp_path: Path) -> None:
    """On a server of its own: one that has seen predicts held for seconds (the tests above) would refuse the short
    deadline at once as unmeetable (`deadline_unmeetable`) instead of letting it expire in the queue."""
    flags = ["--max-batch-size", "2", "--model-workers", "1", "--max-timeout-ms", "5000", *SAME_PROCESS[arch]]
    with Server([model_path("Gate")], arch, *flags) as server, concurrent.futures.ThreadPoolExecutor(2) as pool:
        busy = pool.submit(predict, server, "gate", [_gate(tmp_path, "busy")])
        wait_for_file(tmp_path / "busy.started")
        late = predict(server, "gate", [_gate(tmp_path, "late")], headers={"X-Request-Timeout-Ms": "300"})
        assert late.status_code == 504, late.text
        assert error_fields(late.json())["code"] == "deadline_exceeded"
        _release(tmp_path, "busy")
        _release(tmp_path, "after")
        assert busy.result(timeout=30).status_code == 200
        assert predict(server, "gate", [_gate(tmp_path, "after")]).status_code == 200
        assert not (tmp_path / "late.started").exists()
        assert _rejected(server, "deadline") == 1
        bad = predict(server, "gate", [_gate(tmp_path, "x")], headers={"X-Request-Timeout-Ms": "soon"})
        assert bad.status_code == 400
        assert "X-Request-Timeout-Ms" in error_fields(bad.json())["message"]


def test_killed_model_worker_fails_only_its_batch_and_is_replaced(tmp_path: Path) -> None:
    flags = ["--model-workers", "2", "--max-batch-size", "1", "--workers", "1"]
    with Server([model_path("Gate"), model_path("Echo")], "hybrid", *flags) as server:
        before = HTTP.get(server.url + "/v1/models/gate").json()["serving"]["worker_pids"]
        assert len(before) == 2
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            doomed = pool.submit(predict, server, "gate", [_gate(tmp_path, "doomed")])
            wait_for_file(tmp_path / "doomed.started")
            victim = int((tmp_path / "doomed.started").read_text())
            assert victim in before
            _release(tmp_path, "free")  # traffic the surviving worker can answer at once
            load = [pool.submit(predict, server, "gate", [_gate(tmp_path, "free")]) for _ in range(30)]
            os.kill(victim, signal.SIGKILL)
            died = doomed.result(timeout=30)
            assert died.status_code == 503, died.text
            assert error_fields(died.json())["code"] == "worker_died"
            assert str(victim) in error_fields(died.json())["message"]
            statuses = [r.result(timeout=60).status_code for r in load]
        assert set(statuses) <= {200, 503} and statuses.count(200) >= len(statuses) - 1
        deadline = time.monotonic() + 60
        while True:
            serving = HTTP.get(server.url + "/v1/models/gate").json()["serving"]
            if len(serving["worker_pids"]) == 2 and victim not in serving["worker_pids"]:
                break
            assert time.monotonic() < deadline, f"worker never replaced: {serving}"
            time.sleep(0.05)
        assert serving["workers_replaced"] == 1
        answers = [predict(server, "gate", [_gate(tmp_path, "free")]) for _ in range(6)]
        assert all(a.json() == {"predictions": ["released"]} for a in answers)
        assert predict(server, "echo", [1]).json() == {"predictions": [1]}


@pytest.mark.parametrize("arch", ARCHS)
def test_rate_limit_is_429_with_retry_after(arch: str) -> None:
    with Server([model_path("Echo")], arch, "--workers", "1", "--rate-limit", "0.01", "--rate-burst", "2") as server:
        statuses = [predict(server, "echo", [i]) for i in range(4)]
        assert [r.status_code for r in statuses[:2]] == [200, 200]
        limited = statuses[2]
        assert limited.status_code == 429
        assert error_fields(limited.json())["code"] == "rate_limited"
        assert int(limited.headers["retry-after"]) >= 1
        assert HTTP.get(server.url + "/v2/health/ready").status_code == 200  # probes are never limited
        assert sample(scrape(server), "twinserve_rejected_requests_total", model="echo", reason="rate_limit") == 2


@pytest.mark.parametrize("arch", ARCHS)
def test_rate_limit_holds_for_the_whole_server_not_per_worker(arch: str) -> None:
    """`--rate-limit 0.01 --rate-burst 5` on two worker processes admits exactly 5 of a burst of 12, whichever
    worker takes each, and the 429 names the rate the user set (not a per-process share)."""
    flags = ("--workers", "2", "--rate-limit", "0.01", "--rate-burst", "5")
    with Server([model_path("Echo")], arch, *flags) as server:
        answers = [predict(server, "echo", [i], headers={"connection": "close"}) for i in range(12)]
        assert [a.status_code for a in answers].count(200) == 5
        limited = [a for a in answers if a.status_code == 429]
        assert len(limited) == 7
        assert all("rate limit of 0.01 requests/s exceeded" in error_fields(a.json())["message"] for a in limited)


@pytest.mark.parametrize("arch", ARCHS)
def test_cache_answers_repeats_without_computing(arch: str) -> None:
    with Server([model_path("BatchRecorder")], arch, "--workers", "1", "--cache-size", "100") as server:
        first = predict(server, "batchrecorder", ["a", {"k": 1, "j": 2}]).json()["predictions"]
        again = predict(server, "batchrecorder", [{"j": 2, "k": 1}, "new", "a"]).json()["predictions"]
        assert again[0] == first[1] and again[2] == first[0]  # same predict call: served from the cache
        assert again[1]["call"] != first[0]["call"] and again[1]["size"] == 1  # only the new one was computed
        cache = HTTP.get(server.url + "/v1/models/batchrecorder").json()["serving"]["cache"]
        assert cache["hits"] == 2 and cache["misses"] == 3 and cache["entries"] == 3


@pytest.mark.parametrize("arch", ["async", "hybrid"])  # gunicorn's sync workers cannot see a client leave
def test_client_that_disconnects_while_queued_leaves_the_queue(arch: str, tmp_path: Path) -> None:
    flags = ["--max-batch-size", "1", "--model-workers", "1", "--workers", "1"]
    with Server([model_path("Gate")], arch, *flags) as server, concurrent.futures.ThreadPoolExecutor(2) as pool:
        busy = pool.submit(predict, server, "gate", [_gate(tmp_path, "busy")])
        wait_for_file(tmp_path / "busy.started")
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection
            predict(server, "gate", [_gate(tmp_path, "gone")], timeout=0.5)
        _release(tmp_path, "busy")
        assert busy.result(timeout=30).status_code == 200
        _release(tmp_path, "after")
        assert predict(server, "gate", [_gate(tmp_path, "after")]).status_code == 200
        assert not (tmp_path / "gone.started").exists()
        batches = HTTP.get(server.url + "/v1/models/gate").json()["serving"]["batches"]
        assert batches["cancelled"] == 1 and batches["count"] == 2
