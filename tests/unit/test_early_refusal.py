"""`EarlyRefusal` (fronts/early.py), the sync poller's decision alone: over a real `Admission` and a stand-in service
whose model's queue is full or not. The real servers' refusals are tests/live/hardening/test_early_refusal.py's."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, cast

from twinserve.config import Config
from twinserve.core.admission import Admission, QueueBound
from twinserve.core.batch_queue import BatchQueue, Pending
from twinserve.errors import ModelNotFound, PayloadTooLarge, QueueFull
from twinserve.fronts.early import EarlyRefusal, Refusal
from twinserve.servers.sync.answers import front_answer
from twinserve.service.admission import Admitted
from twinserve.service.contract import Service
from twinserve.service.hosts import host_policy

BODY_HEADERS = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"), (b"content-length", b"20")]


@dataclass
class _Spec:
    version: str = "1"


@dataclass
class _Runtime:
    """A model whose queue holds `queued` of `bound.limit` instances."""

    config: Config
    queued: int
    bound: QueueBound
    name: str = "m"
    ready: bool = True
    spec: _Spec = field(default_factory=_Spec)

    @property
    def crowded(self) -> bool:
        return self.queued >= self.bound.limit_for(self.bound.levels)

    def early_refusal(self, priority: int = 1) -> QueueFull | None:
        return self.bound.refusal(self.queued, 1, f"the queue holds {self.queued} instances", priority)

    def refuse_early(self, priority: int = 1) -> None:
        error = self.early_refusal(priority)
        if error is not None:
            raise error


@dataclass
class _Registry:
    traffic: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Service:
    config: Config
    runtime_: _Runtime
    auth: Any = None
    cors: Any = None
    max_body_bytes: int = 1000
    counted: list[tuple[Any, ...]] = field(default_factory=list)
    registry: _Registry = field(default_factory=_Registry)

    def __post_init__(self) -> None:
        self.admission = Admission(self.config)
        self.hosts = host_policy(self.config)
        self.checks_host = not self.hosts.any_host
        self.runtimes = {"m": self.runtime_}

    def runtime(self, model: str, version: str | None = None) -> _Runtime:
        if model != "m" or version not in (None, "1"):
            raise ModelNotFound(f"no model {model!r}")
        return self.runtime_

    def route(
        self, endpoint: str, model: str, version: str | None = None, headers: Any = None
    ) -> tuple[_Runtime, None]:
        """`Service.route` without a traffic split (the refusal leaves a split model to the app)."""
        return self.runtime(model, version), None

    def refused_early(self, *counted: Any) -> None:
        self.counted.append(counted)

    def too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge("too large")


def _early(queued: int, **settings: Any) -> tuple[EarlyRefusal, _Service]:
    config = Config(priority_levels=2, default_priority=2, max_queue=4, **settings)
    service = _Service(config, _Runtime(config, queued, QueueBound(4, 2)))
    return EarlyRefusal(cast(Service, service)), service


def _refuse(
    early: EarlyRefusal, url: bytes = b"/v1/models/m:predict", *extra: tuple[bytes, bytes]
) -> tuple[str, list[tuple[str, str]], bytes] | None:
    """What the sync worker's poller writes for the request (its `verdict`, then the front's answer), else None:
    the app's to answer."""
    verdict = early.verdict(b"POST", url, [*BODY_HEADERS, *extra])
    return front_answer(verdict) if isinstance(verdict, Refusal) else None


def test_a_full_queue_is_refused_with_the_apps_503() -> None:
    early, service = _early(queued=2)  # priority 2 (the default) may fill 2 of 4
    answer = _refuse(early, b"/v1/models/m:predict", (b"x-request-id", b"abc"))
    assert answer is not None
    status, headers, body = answer
    assert status == "503 SERVICE UNAVAILABLE"
    assert headers == [
        ("Retry-After", "1"),
        ("Content-Type", "application/json"),
        ("Content-Length", str(len(body))),
        ("X-Request-ID", "abc"),
    ]
    error = json.loads(body)
    assert error["code"] == QueueFull.code and error["request_id"] == "abc"
    assert service.counted == [("m", "1", "predict", 2, 503, "queue_full")]


def test_a_model_with_a_traffic_split_is_routed_by_the_app_unless_the_version_is_named() -> None:
    early, service = _early(queued=2)
    service.registry.traffic["m"] = object()  # the version that answers is drawn per request
    assert _refuse(early) is None and not service.counted
    assert _refuse(early, b"/v1/models/m/versions/1:predict") is not None  # a named version is not split


def test_v2_has_its_own_error_body() -> None:
    early, _ = _early(queued=2)
    answer = _refuse(early, b"/v2/models/m/versions/1/infer?x=1")
    assert answer is not None and set(json.loads(answer[2])) == {"error"}


def test_what_the_queue_still_takes_goes_to_the_app_with_what_was_decided() -> None:
    """Let in from its head under a crowd, a request carries its level and model to the app, which takes them as
    made (`Exchange.admit`): decided once. Without a crowd nothing is decided here: the app decides."""
    early, service = _early(queued=2)
    decided = early.verdict(b"POST", b"/v1/models/m:predict", [*BODY_HEADERS, (b"x-priority", b"1")])
    assert decided == Admitted(1, service.runtime_)  # type: ignore[arg-type]  # priority 1 may fill all 4
    assert not service.counted
    early, service = _early(queued=1)
    assert early.verdict(b"POST", b"/v1/models/m:predict", BODY_HEADERS) is None and not service.counted


def test_requests_the_app_answers_otherwise_are_left_to_it() -> None:
    early, service = _early(queued=4)
    assert early.verdict(b"GET", b"/v1/models/m:predict", BODY_HEADERS) is None
    assert _refuse(early, b"/v1/models/m:stream") is None  # streams are not batched
    assert _refuse(early, b"/v1/models/other:predict") is None  # 404
    assert _refuse(early, b"/v1/models/m/ws") is None
    assert _refuse(early, b"/v1/models/m:predict", (b"x-priority", b"7")) is None  # 400
    assert _refuse(early, b"/v1/models/m:predict", (b"transfer-encoding", b"chunked")) is None
    assert _refuse(early, b"/v1/models/m:predict", (b"expect", b"100-continue")) is None
    too_large = [(b"host", b"127.0.0.1"), (b"content-length", b"1001")]
    assert early.verdict(b"POST", b"/v1/models/m:predict", too_large) is None  # 413
    foreign = [(b"host", b"evil.example"), (b"content-length", b"2")]
    assert early.verdict(b"POST", b"/v1/models/m:predict", foreign) is None  # the allowed hosts' 400
    service.runtime_.ready = False
    assert _refuse(early) is None
    assert not service.counted


def test_with_api_keys_or_cors_on_nothing_is_refused_before_the_app() -> None:
    config = Config(max_queue=1)
    for auth, cors in ((object(), None), (None, object())):
        service = _Service(config, _Runtime(config, 1, QueueBound(1)), auth=auth, cors=cors)
        assert not EarlyRefusal(cast(Service, service)).active


def test_the_sync_backlog_refuses_from_the_head() -> None:
    early, service = _early(queued=0)
    url, head = b"/v1/models/m:predict", [(b"content-length", b"5")]
    assert early.verdict(b"POST", url, head, backlog=2) is None  # priority 2 may have 2 waiting: no crowd
    let_in = early.verdict(b"POST", url, [*head, (b"x-priority", b"1")], backlog=3)  # priority 1 may have 4
    assert let_in == Admitted(1, service.runtime_)  # type: ignore[arg-type]
    refusal = early.verdict(b"POST", url, [*head, (b"x-request-id", b"id-1")], backlog=3)  # past priority 2's 2
    assert isinstance(refusal, Refusal)
    reply, request_id = refusal.reply()
    assert reply.status == 503 and request_id == "id-1" and reply.headers == {"Retry-After": "1"}
    assert service.counted == [("m", "1", "predict", 2, 503, "queue_full")]
    assert early.verdict(b"POST", url, [*head, (b"transfer-encoding", b"chunked")], backlog=3) is None


def test_crowded_means_the_lowest_level_may_be_refused() -> None:
    queue: BatchQueue[None] = BatchQueue(1, 0.0, max_queue=4, max_in_flight=1, levels=2)
    for expected in (False, False, True):  # level 2's share is 2 of the 4
        assert queue.crowded is expected
        queue.put(Pending([0.0], 0.0, None, None, context=None))
    admission = Admission(Config(max_queue=4, priority_levels=2))
    assert not admission.backlog_crowded(2) and admission.backlog_crowded(3)
