"""Failure isolation on real servers: a poisoned batch answers its good requests in every architecture."""

from __future__ import annotations

import concurrent.futures
import math
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ARCHS
from tests.errors import error_fields
from tests.live.test_engine import SAME_PROCESS, wait_for_queue
from tests.serving import HTTP, Server, model_path, predict, sample, scrape, wait_for_file

#: One request each, queued in this order into one batch: (request id, instances, predictions or None if 500).
REQUESTS: list[tuple[str, list[str], list[str] | None]] = [
    ("req-a", ["a"], ["A"]),
    ("req-b", ["poison"], None),
    ("req-c", ["c", "d"], ["C", "D"]),
    ("req-d", ["e", "poison"], None),  # one poisoned instance fails its whole request
    ("req-e", ["f"], ["F"]),
]
INSTANCES = sum(len(instances) for _, instances, _ in REQUESTS)


def _one_batch(server: Server, model: str, tmp_path: Path) -> list[httpx.Response]:
    """Hold the only model worker with a gated request, queue REQUESTS in order behind it, release: they form
    one batch (the batch size metric checks it)."""
    with concurrent.futures.ThreadPoolExecutor(len(REQUESTS) + 1) as pool:
        busy = pool.submit(predict, server, model, [{"gate": str(tmp_path / model)}])
        wait_for_file(tmp_path / f"{model}.started")
        futures, queued = [], 0
        for request_id, instances, _ in REQUESTS:
            headers = {"X-Request-ID": request_id}
            futures.append(pool.submit(predict, server, model, instances, headers=headers))
            queued += len(instances)
            wait_for_queue(server, model, queued)
        (tmp_path / f"{model}.release").touch()
        assert busy.result(timeout=60).json() == {"predictions": ["released"]}
        return [f.result(timeout=60) for f in futures]


def _batches(samples: dict[Any, float], model: str) -> tuple[float, float]:
    return sample(samples, "twinserve_batch_size_count", model=model), sample(
        samples, "twinserve_batch_size_sum", model=model
    )


@pytest.mark.parametrize("arch", ARCHS)
def test_only_the_poisoned_requests_of_a_batch_fail(arch: str, tmp_path: Path) -> None:
    flags = ["--max-batch-size", "16", "--model-workers", "1", *SAME_PROCESS[arch]]
    with Server([model_path("Poison"), model_path("PoisonWhole")], arch, *flags) as server:
        responses = _one_batch(server, "poison", tmp_path)
        for response, (request_id, _, expected) in zip(responses, REQUESTS, strict=True):
            assert response.headers["x-request-id"] == request_id
            if expected is None:
                assert response.status_code == 500, response.text
                error = error_fields(response.json())
                assert error["code"] == "model_error" and "'poison' raised in predict" in error["message"]
                assert "poisoned batch" not in error["message"]  # the model's own text stays in the log
                assert error["request_id"] == request_id
            else:
                assert response.status_code == 200, response.text
                assert response.json() == {"predictions": expected}
        samples = scrape(server)
        # Two predict calls as batches: the gated one, then all five requests together.
        assert _batches(samples, "poison") == (2, 1 + INSTANCES)
        assert sample(samples, "twinserve_batch_isolations_total", model="poison") == 1
        reruns = sample(samples, "twinserve_batch_isolation_reruns_total", model="poison")
        # [a b | c d e] -> [a | b], [c | d e] -> [d | e]: 8 re-runs, within 2·k·⌈log2 m⌉ = 12.
        assert reruns == 8 <= 2 * 2 * math.ceil(math.log2(len(REQUESTS)))
        outcomes = {
            outcome: sample(samples, "twinserve_batch_isolation_requests_total", model="poison", outcome=outcome)
            for outcome in ("answered", "failed")
        }
        assert outcomes == {"answered": 3, "failed": 2}
        isolation = HTTP.get(server.url + "/v1/models/poison").json()["serving"]["failure_isolation"]
        assert isolation == {"max_reruns": 32, "batches": 1, "reruns": 8, "failed_requests": 2}
        server.wait_for_output("isolated 2 failing request(s) req-b, req-d, 3 answered")

        # The model that opts out: the same batch fails for every request in it, computed once.
        whole = _one_batch(server, "poison-whole", tmp_path)
        assert [r.status_code for r in whole] == [500] * len(REQUESTS)
        assert {error_fields(r.json())["code"] for r in whole} == {"model_error"}
        samples = scrape(server)
        assert _batches(samples, "poison-whole") == (2, 1 + INSTANCES)
        assert sample(samples, "twinserve_batch_isolations_total", model="poison-whole") == 0
        serving = HTTP.get(server.url + "/v1/models/poison-whole").json()["serving"]
        assert serving["failure_isolation"]["max_reruns"] == 0


def test_isolation_can_be_turned_off_for_every_model(tmp_path: Path) -> None:
    flags = ["--max-batch-size", "16", "--model-workers", "1", "--no-isolate-failures", *SAME_PROCESS["async"]]
    with Server([model_path("Poison")], "async", *flags) as server:
        responses = _one_batch(server, "poison", tmp_path)
        assert [r.status_code for r in responses] == [500] * len(REQUESTS)
        assert sample(scrape(server), "twinserve_batch_isolations_total", model="poison") == 0
