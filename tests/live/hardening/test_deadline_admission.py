"""Deadline-aware admission and priority lanes on a real server, in every architecture.

A request whose deadline the queued work would outlast is refused on arrival (504 `deadline_unmeetable`) and
never computed; under a full queue the lowest priority level is refused first.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ARCHS
from tests.errors import error_fields
from tests.live.hardening.harness import HERE
from tests.serving import HTTP, Server, sample, scrape

# serial: admission compares deadlines with the measured service time
pytestmark = pytest.mark.serial

LEDGER = f"{HERE / 'models.py'}:Ledger"
#: One batch of at most two requests at a time (50 ms each, see models.py): the queue ahead is easy to reason about.
FLAGS = (
    "--workers",
    "1",
    "--threads",
    "32",
    "--model-workers",
    "1",
    "--max-batch-size",
    "2",
    "--max-batch-delay-ms",
    "0",
)
DEADLINE_MS = 150
CROWD = 16
#: A batch's time in the priority test: two requests per 0.3 s, far slower than 36 threads send them.
CROWDED_SECONDS = 0.3


def _predict(
    server: Server, ledger: Path, name: str, headers: dict[str, str], seconds: float | None = None
) -> httpx.Response:
    instance: dict[str, Any] = {"ledger": str(ledger), "id": name}
    if seconds is not None:
        instance["seconds"] = seconds
    body = {"instances": [instance]}
    return HTTP.post(f"{server.url}/v1/models/ledger:predict", json=body, headers=headers, timeout=30)


@pytest.mark.parametrize("arch", ARCHS)
def test_a_deadline_the_queue_cannot_meet_is_refused_at_once_and_never_computed(arch: str, tmp_path: Path) -> None:
    with Server([LEDGER], arch, *FLAGS) as server:
        for i in range(4):  # batches measured: the queue now knows how long one takes
            assert _predict(server, tmp_path, f"warm{i}", {}).status_code == 200
        headers = {"X-Request-Timeout-Ms": str(DEADLINE_MS)}
        with ThreadPoolExecutor(CROWD) as pool:
            answers = list(pool.map(lambda i: _predict(server, tmp_path, f"crowd{i}", headers), range(CROWD)))
        codes = {
            f"crowd{i}": None if a.status_code == 200 else error_fields(a.json())["code"] for i, a in enumerate(answers)
        }
        assert {a.status_code for a in answers} <= {200, 504}, [a.text for a in answers]
        refused = [name for name, code in codes.items() if code == "deadline_unmeetable"]
        assert refused, codes  # 16 requests, 2 per 50 ms batch, 150 ms each: most cannot be met
        begun = {p.name for p in tmp_path.iterdir()}
        assert not begun & set(refused), f"computed although refused: {sorted(begun & set(refused))}"
        assert any(code is None for code in codes.values()), codes  # the first ones still met their deadline
        message = error_fields(json.loads(answers[list(codes).index(refused[0])].text))["message"]
        assert "past the request's deadline" in message


@pytest.mark.parametrize("arch", ARCHS)
def test_the_lowest_priority_is_refused_first_when_the_queue_fills(arch: str, tmp_path: Path) -> None:
    """`--max-queue 6` over 3 levels: level 3 may fill 2 places, level 2 four, level 1 all six. A crowd of each
    level at once: level 3 is refused most, level 1 least. Each batch takes CROWDED_SECONDS, so the queue fills
    however slowly the test's own 36 threads send (at 50 ms a batch, a loaded CI machine once sent them no
    faster than the model served them, and none was refused)."""
    flags = (*FLAGS, "--max-queue", "6", "--priority-levels", "3")
    with Server([LEDGER], arch, *flags) as server:
        with ThreadPoolExecutor(36) as pool:
            jobs = [(level, i) for i in range(12) for level in (1, 2, 3)]
            answers = list(
                pool.map(
                    lambda j: _predict(server, tmp_path, f"p{j[0]}-{j[1]}", {"X-Priority": str(j[0])}, CROWDED_SECONDS),
                    jobs,
                )
            )
        served = {level: 0 for level in (1, 2, 3)}
        for (level, _), answer in zip(jobs, answers, strict=True):
            assert answer.status_code in (200, 503), answer.text
            if answer.status_code == 200:
                served[level] += 1
            else:
                assert error_fields(answer.json())["code"] == "queue_full" and answer.headers["retry-after"] == "1"
        assert served[1] > served[3], served  # arrival order is the scheduler's: only the extremes are certain
        samples = scrape(server)
        for level in (1, 2, 3):
            labels = {"model": "ledger", "priority": str(level)}
            assert sample(samples, "twinserve_priority_requests_total", **labels, outcome="ok") == served[level]
            refused = sample(samples, "twinserve_priority_requests_total", **labels, outcome="refused")
            assert refused == 12 - served[level]
