"""One JSON event per request, in one format, with the request id carried into the model's own log lines."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.conftest import ARCHS
from tests.serving import HTTP, Server, model_path

CHATTY = model_path("Chatty")


def json_lines(output: str) -> list[dict[str, Any]]:
    """Every line of the server's output must be one JSON object: nothing escapes the pipeline."""
    lines = [line for line in output.splitlines() if line.strip()]
    return [json.loads(line) for line in lines]


def send(server: Server, request_id: str, body: bytes = b'{"instances": [1, 2]}') -> httpx.Response:
    return HTTP.post(
        f"{server.url}/v1/models/chatty:predict",
        content=body,
        headers={"X-Request-Id": request_id, "Content-Type": "application/json"},
        timeout=30,
    )


@pytest.mark.parametrize("arch", ARCHS)
def test_one_event_per_request_and_the_model_logs_carry_its_id(arch: str) -> None:
    with Server([CHATTY], arch, "--workers", "2", "--model-workers", "2", "--log-format", "json") as server:
        ids = [f"{arch}-req-{i}" for i in range(6)]
        for rid in ids:
            assert send(server, rid).json() == {"predictions": [2.0, 4.0]}
        assert send(server, f"{arch}-bad", b'{"instances": ["x"]}').status_code == 422
        assert HTTP.get(f"{server.url}/no/such/route", headers={"X-Request-Id": f"{arch}-404"}).status_code == 404
        server.wait_for_output(f"{arch}-404")
        events = json_lines(server.output())

    requests = [e for e in events if e.get("logger") == "twinserve.access"]
    by_id = {e["request_id"]: e for e in requests}
    assert len(requests) == len(by_id) == len(ids) + 2, "each request is logged exactly once"
    for rid in ids:
        event = by_id[rid]
        assert event["event"] == "request"
        assert event["level"] == "info"
        assert (event["method"], event["path"], event["model"], event["endpoint"]) == (
            "POST",
            "/v1/models/chatty:predict",
            "chatty",
            "predict",
        )
        assert (event["arch"], event["status"], event["error"]) == (arch, 200, None)
        assert event["batch_size"] == 2  # one request at a time: each batch is that request's two instances
        assert event["latency_ms"] > 0
        assert event["queue_wait_ms"] >= 0
        assert event["timestamp"].endswith("Z")
    assert (by_id[f"{arch}-bad"]["status"], by_id[f"{arch}-bad"]["error"]) == (422, "validation_failed")
    assert by_id[f"{arch}-bad"]["batch_size"] is None  # refused before any batch
    assert (by_id[f"{arch}-404"]["endpoint"], by_id[f"{arch}-404"]["status"]) == ("unknown", 404)

    model_lines = [e for e in events if e.get("logger") == "chatty"]
    assert sorted(e["request_id"] for e in model_lines) == sorted(ids)
    assert all(e["event"] == "chatty computing 2" for e in model_lines)
    if arch == "hybrid":  # logged in a model-worker process, not the server process that took the request
        server_pids = {by_id[rid]["pid"] for rid in ids}
        assert {e["pid"] for e in model_lines}.isdisjoint(server_pids)
    else:
        assert all(e["pid"] == by_id[e["request_id"]]["pid"] for e in model_lines)
    # The servers' own messages (gunicorn's, uvicorn's) come through the same pipeline.
    assert any(e.get("logger", "").startswith(("gunicorn", "uvicorn")) for e in events)


@pytest.mark.parametrize("arch", ARCHS)
def test_a_shared_batch_logs_every_request_id_it_computes(arch: str) -> None:
    """Across the batcher's thread (sync), task (async) and process (hybrid) boundaries."""
    with Server(
        [CHATTY],
        arch,
        "--workers",
        "1",
        "--threads",
        "8",
        "--max-batch-size",
        "8",
        "--max-batch-delay-ms",
        "200",
        "--log-format",
        "json",
    ) as server:
        ids = [f"{arch}-batch-{i}" for i in range(4)]
        with ThreadPoolExecutor(len(ids)) as pool:
            replies = list(pool.map(lambda rid: send(server, rid, b'{"instances": [1]}'), ids))
        assert all(r.status_code == 200 for r in replies)
        server.wait_for_output(f'"request_id":"{ids[-1]}"')
        events = json_lines(server.output())

    model_lines = [e for e in events if e.get("logger") == "chatty"]
    seen: list[str] = []
    for line in model_lines:
        batch = line.get("request_ids") or [line["request_id"]]
        assert line["event"] == f"chatty computing {len(batch)}"
        seen.extend(batch)
    assert sorted(seen) == sorted(ids)
    assert len(model_lines) < len(ids), "the delay should have gathered some requests into one batch"
    access = {e["request_id"]: e for e in events if e.get("logger") == "twinserve.access"}
    assert sum(1 for rid in ids if access[rid]["batch_size"] > 1) >= 2


def test_console_format_and_access_log_switch() -> None:
    with Server([CHATTY], "async", "--log-format", "console", "--no-access-log") as server:
        send(server, "console-1")
        server.wait_for_output("chatty computing 2")
        output = server.output()
    line = next(line for line in output.splitlines() if "chatty computing 2" in line)
    assert not line.lstrip().startswith("{")
    assert "request_id" in line and "console-1" in line
    assert "twinserve.access" not in output


def test_the_stamp_matches_structlogs_own_processors(monkeypatch: pytest.MonkeyPatch) -> None:
    """`_Stamp` stands for `add_log_level` + `TimeStamper(fmt="iso", utc=True)` + the pid: the same keys and values
    (the time always with six digits of microseconds, where `isoformat` drops them on a whole second)."""
    import datetime
    import os
    import time

    import structlog

    from twinserve.observability.logging import _Stamp

    stamp = _Stamp()
    for method in ("debug", "info", "warn", "warning", "exception", "critical"):
        ours = stamp(None, method, {"event": "x"})
        theirs = structlog.processors.add_log_level(None, method, {"event": "x"})
        assert ours["level"] == theirs["level"]
        assert ours["pid"] == os.getpid()
    for ns in (1_764_800_000_000_000_000, 1_764_800_000_123_456_789, 1_764_800_001_000_999_999):
        monkeypatch.setattr(time, "time_ns", lambda ns=ns: ns)
        when = datetime.datetime.fromtimestamp(ns // 10**9, tz=datetime.UTC).replace(microsecond=ns // 1000 % 10**6)
        rendered = stamp(None, "info", {})["timestamp"]
        assert rendered == when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        assert datetime.datetime.fromisoformat(rendered) == when
