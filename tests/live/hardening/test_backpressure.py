"""Backpressure before rejection: a crowd the server can serve within `--max-queue-wait-ms` waits, it is not refused.

A closed-loop client refused with 503 comes straight back, so refusing work the server would finish within a
second only trades answers for refusals. Past `--max-queue` (by count) a request is still queued while the
measured wait ahead of it is within `--max-queue-wait-ms`; with it at 0 the count bound alone decides, as before.
The same crowd, in every architecture, against the same model: all answered with the wait bound, some refused
without it. (Behaviour, not timing: the crowd's wait, about 0.1-0.4 s, is far inside the 1 s bound.)
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.conftest import ARCHS
from tests.live.hardening.harness import BODY, SLEEPY
from tests.serving import Server

# serial: whether a crowd waits or is refused depends on the measured service time
pytestmark = pytest.mark.serial

#: One process, one request thread (sync) or one model worker taking 50 ms a batch of up to 4; a queue of 2.
FLAGS = ["--workers", "1", "--threads", "1", "--model-workers", "1", "--max-batch-size", "4", "--max-queue", "2"]
CROWD = 8
ROUNDS = 3
#: Sequential requests first, so the server has measured its time per request / per batch.
WARM_REQUESTS = 12


def _statuses(server: Server) -> list[int]:
    url = f"{server.url}/v1/models/sleepy:predict"
    headers = {"Content-Type": "application/json"}
    with httpx.Client(timeout=30) as client:
        for _ in range(WARM_REQUESTS):
            assert client.post(url, content=BODY, headers=headers).status_code == 200
    statuses: list[int] = []

    def one(_: int) -> int:
        with httpx.Client(timeout=30) as client:
            return client.post(url, content=BODY, headers=headers).status_code

    with ThreadPoolExecutor(CROWD) as pool:
        for _ in range(ROUNDS):
            statuses += pool.map(one, range(CROWD))
    return statuses


@pytest.mark.hardening
@pytest.mark.parametrize("arch", ARCHS)
def test_a_crowd_served_within_the_wait_bound_waits_instead_of_being_refused(arch: str) -> None:
    with Server([SLEEPY], arch, *FLAGS) as server:  # the default --max-queue-wait-ms, 1000
        statuses = _statuses(server)
    assert statuses == [200] * CROWD * ROUNDS


@pytest.mark.hardening
@pytest.mark.parametrize("arch", ARCHS)
def test_without_a_wait_bound_the_same_crowd_is_refused_past_the_count(arch: str) -> None:
    with Server([SLEEPY], arch, *FLAGS, "--max-queue-wait-ms", "0") as server:
        statuses = _statuses(server)
    assert set(statuses) == {200, 503}, statuses
