"""The sync poller's admission (servers/sync/admission.py) decides a request from its head once: a request whose
body is still arriving is asked about once, not again on each piece of it nor once it is whole, and what was
decided travels with the request to the threads (`Request.decided`, which the worker puts in the WSGI environ).
IO-free: a stand-in `EarlyRefusal` that counts what it is asked, a real `Admission` and thread pool."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pytest

from twinserve.config import Config
from twinserve.core.admission import Admission
from twinserve.errors import QueueFull
from twinserve.fronts.early import EarlyRefusal, Head, Refusal
from twinserve.servers.sync.admission import PollerAdmission
from twinserve.servers.sync.http import Request
from twinserve.servers.sync.threads import LevelledThreadPool
from twinserve.service.admission import Admitted


class _Early:
    """What the poller asks of `EarlyRefusal`, under a crowd that never ends; each verdict is `answer`."""

    def __init__(self, answer: Refusal | Admitted | None) -> None:
        self.service = self  # `PollerAdmission` reads `early.service.admission`
        self.admission = Admission(Config(max_queue_wait_ms=0))  # nothing held: each request goes on or is refused
        self.answer, self.asked = answer, 0

    def crowded(self, backlog: int | None = None) -> bool:
        return True

    def verdict(self, *head: Any) -> Refusal | Admitted | None:
        self.asked += 1
        return self.answer


class _Log:
    def debug(self, *args: Any) -> None:
        pass


@pytest.fixture
def pool() -> Iterator[LevelledThreadPool]:
    pool = LevelledThreadPool(1, lambda request: 1)
    yield pool
    pool.shutdown(wait=False)


def _request() -> Request:
    headers = [(b"host", b"t"), (b"content-length", b"5")]
    return Request("POST", b"/v1/models/m:predict", "1.1", headers, True, 5, False, False)


def _gate(early: _Early, pool: LevelledThreadPool) -> tuple[PollerAdmission, list[Any], list[Any]]:
    submitted: list[Any] = []
    answered: list[Any] = []
    gate = PollerAdmission(
        cast(EarlyRefusal, early),
        pool,
        1,
        lambda conn, request: submitted.append((conn, request)),
        lambda conn, request, refusal: answered.append((conn, request, refusal)),
        _Log(),
    )
    return gate, submitted, answered


def test_a_request_decided_from_its_head_is_not_asked_about_again(pool: LevelledThreadPool) -> None:
    decided = Admitted(2, cast(Any, object()))
    early = _Early(decided)
    gate, submitted, answered = _gate(early, pool)
    request = _request()
    assert gate.refusal_from_head(request) is None  # its body on its way
    assert gate.refusal_from_head(request) is None  # another piece of it
    gate.admit("conn", request)  # whole
    assert early.asked == 1
    assert submitted == [("conn", request)] and not answered
    assert request.decided is decided  # for the app, which takes it as made


def test_a_whole_request_not_decided_before_is_decided_once_when_it_is_let_in(pool: LevelledThreadPool) -> None:
    decided = Admitted(1, cast(Any, object()))
    early = _Early(decided)
    gate, submitted, _ = _gate(early, pool)
    request = _request()
    gate.admit("conn", request)
    assert (early.asked, submitted, request.decided) == (1, [("conn", request)], decided)


def test_a_refused_request_is_answered_by_the_poller_and_never_handed_on(pool: LevelledThreadPool) -> None:
    refusal = Refusal(QueueFull("full"), Head("/v1/models/m:predict", None, None, None))
    early = _Early(refusal)
    gate, submitted, answered = _gate(early, pool)
    request = _request()
    gate.admit("conn", request)
    assert answered == [("conn", request, refusal)] and not submitted and request.decided is None
