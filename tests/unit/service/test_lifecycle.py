"""A request's life without a transport (service/lifecycle.py, service/exchange.py): the stages an exchange moves
through, the moves it refuses, admission from a `RequestHead` alone, closing (logging, counting, releasing) once,
and the body rule both HTTP fronts apply. Over a real `Service` and a real, loaded model; no socket, no app."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import orjson
import pytest
from prometheus_client import REGISTRY

from tests.unit.service.echo import echo_service
from twinserve.errors import (
    ClientError,
    HeadersTooLarge,
    MalformedHttp,
    ModelNotFound,
    PayloadTooLarge,
    QueueFull,
    RateLimited,
    RequestTimeout,
    TwinserveError,
    UnsupportedMediaType,
)
from twinserve.service.admission import Admitted, RequestHead, admit
from twinserve.service.contract import Service
from twinserve.service.cors import merge_vary
from twinserve.service.exchange import Exchange
from twinserve.service.lifecycle import MOVES, IllegalTransition, Stage

MODEL = "lifecycle-echo"
PATH = f"/v1/models/{MODEL}:predict"
BODY = orjson.dumps({"instances": ["a", "b"]})


@pytest.fixture(scope="module")
def service() -> Iterator[Service]:
    with echo_service(MODEL, max_body_bytes=1000, read_timeout_s=7) as service:
        yield service


def _open(service: Service, endpoint: str = "predict") -> Exchange:
    return Exchange.open(service, endpoint, "POST", PATH, {}, None, model=MODEL)


def _head(**fields: object) -> RequestHead:
    given: dict[str, object] = {"content_type": "application/json", "content_length": len(BODY)} | fields
    return RequestHead("predict", MODEL, **given)  # type: ignore[arg-type]


def _stage(exchange: Exchange) -> Stage:
    """Where `exchange` is now (read through a call: each step moves it, which a type checker cannot follow)."""
    return exchange.stage


def _answered(code: str) -> float:
    labels = {"model": MODEL, "endpoint": "predict", "code": code}
    return REGISTRY.get_sample_value("twinserve_requests_total", labels) or 0.0


def test_a_request_moves_from_open_to_closed_through_each_stage(service: Service) -> None:
    exchange = _open(service)
    assert _stage(exchange) is Stage.OPEN
    runtime = exchange.admit(_head())
    assert _stage(exchange) is Stage.ADMITTED and exchange.runtime is runtime and exchange.deadline is None
    instances = exchange.decode(BODY)
    assert _stage(exchange) is Stage.DECODED and instances == ["a", "b"]
    reply = exchange.encode(runtime.predict(instances, exchange.deadline))
    assert _stage(exchange) is Stage.ANSWERED
    assert (reply.status, orjson.loads(reply.body)) == (200, {"predictions": ["a", "b"]})
    exchange.close()
    assert _stage(exchange) is Stage.CLOSED and exchange.status == 200


def test_the_moves_a_stage_refuses_raise_and_leave_it_where_it_was(service: Service) -> None:
    exchange = _open(service)
    with pytest.raises(IllegalTransition, match="from OPEN to DECODED"):
        exchange.decode(BODY)  # a body read before its head was admitted
    assert _stage(exchange) is Stage.OPEN
    exchange.admit(_head())
    with pytest.raises(IllegalTransition, match="from ADMITTED to ADMITTED"):
        exchange.admit(_head())  # a request is admitted once
    exchange.decode(BODY)
    with pytest.raises(IllegalTransition, match="from DECODED to DECODED"):
        exchange.decode(BODY)  # and parsed once
    exchange.close()
    for late in (lambda: exchange.reply(exchange.fail(ClientError("late"))), lambda: exchange.succeeded()):
        with pytest.raises(IllegalTransition, match="from CLOSED"):
            late()
    assert _stage(exchange) is Stage.CLOSED
    assert MOVES[Stage.CLOSED] == frozenset()  # nothing leaves CLOSED: closing again is no move, it does nothing


def test_a_stream_answers_step_by_step_and_may_fail_after_its_first_step(service: Service) -> None:
    exchange = _open(service)
    exchange.admit(_head())
    exchange.decode(BODY)
    exchange.encode(["a", "b"])
    exchange.encode(["a", "b"])  # its next step: still ANSWERED
    error = exchange.failed(RuntimeError("the model's generator broke"))
    assert (_stage(exchange), exchange.status, error.status) == (Stage.FAILED, 500, 500)
    exchange.responded(200)  # a front's own response after a failure does not hide it
    assert (_stage(exchange), exchange.status) == (Stage.FAILED, 500)
    exchange.close()


def test_closing_counts_and_releases_once_whatever_happened(service: Service) -> None:
    runtime = service.runtimes[MODEL]
    before = {code: _answered(code) for code in ("200", "415", "499")}

    served = _open(service)
    served.admit(_head())
    assert runtime.occupancy.inside == 1
    served.encode(runtime.predict(served.decode(BODY), served.deadline))
    served.close()
    served.close()  # a front's teardown after its after-request hook: nothing more
    assert runtime.occupancy.inside == 0

    refused = _open(service)
    with pytest.raises(UnsupportedMediaType) as caught:
        refused.admit(_head(content_type="text/plain"))
    assert _stage(refused) is Stage.OPEN  # refused from its head: never admitted
    reply = refused.fail(caught.value)
    assert (_stage(refused), reply.status) == (Stage.FAILED, 415)
    refused.close()
    refused.close()
    assert runtime.occupancy.inside == 0  # admitted into the model before the media type was refused; left once

    left = _open(service)
    left.admit(_head())
    left.close()  # closed unanswered: its client left
    assert (left.status, left.error_code) == (499, "client_disconnected")
    left.close()

    after = {code: _answered(code) for code in before}
    assert {code: after[code] - before[code] for code in before} == {"200": 1, "415": 1, "499": 1}


def test_admission_reads_the_head_alone(service: Service) -> None:
    unknown = _open(service)
    with pytest.raises(ModelNotFound):
        unknown.admit(RequestHead("predict", "no-such-model"))
    unknown.close()

    too_large = _open(service)
    with pytest.raises(PayloadTooLarge):  # the declared length, before a byte of the body is read
        too_large.admit(_head(content_length=1001))
    too_large.close()

    timed = _open(service)
    timed.admit(_head(timeout="250", priority="1"))
    assert timed.deadline is not None and timed.context.priority == 1
    timed.close()

    coded = _open(service)
    with pytest.raises(UnsupportedMediaType):
        coded.admit(_head(content_encoding="br"))  # a coding twinserve cannot undo
    coded.close()


def test_what_the_sync_poller_admitted_is_not_decided_again(service: Service) -> None:
    """A head the sync poller admitted under a crowd (fronts/early.py) carries its `Admitted`: the exchange takes it
    as made (the head's own `X-Priority`, route and size are not asked again): a request is admitted once."""
    runtime = service.runtimes[MODEL]
    decided = _open(service)
    assert decided.admit(_head(priority="1", decided=Admitted(3, runtime, deadline=12.5))) is runtime
    assert (decided.context.priority, decided.deadline, _stage(decided)) == (3, 12.5, Stage.ADMITTED)
    decided.close()

    elsewhere = _open(service)  # a route the exchange would refuse (404) if it asked again
    assert elsewhere.admit(RequestHead("predict", "no-such-model", decided=Admitted(2, runtime))) is runtime
    elsewhere.close()


def test_the_body_rule_judges_what_a_front_read(service: Service) -> None:
    rule = service.body
    assert (rule.max_bytes, rule.read_limit, rule.read_timeout_s) == (1000, 1001, 7)
    assert rule.whole(b"x" * 1000) == b"x" * 1000
    rule.within(1000)
    with pytest.raises(PayloadTooLarge):
        rule.within(1001)
    with pytest.raises(PayloadTooLarge):
        rule.whole(b"x" * 1001)
    assert rule.whole(b"abc", 3) == b"abc"
    with pytest.raises(ClientError, match="ended after 2 of the 3 bytes") as short:
        rule.whole(b"ab", 3)
    assert (short.value.status, short.value.headers) == (400, {"Connection": "close"})
    late = rule.late()
    assert isinstance(late, RequestTimeout) and late.status == 408 and late.headers == {"Connection": "close"}
    assert "7 s (--read-timeout-s)" in late.message


def test_one_vary_names_both() -> None:
    assert merge_vary(None, "Origin") == "Origin"
    assert merge_vary("", "Origin") == "Origin"
    assert merge_vary("Accept-Encoding", "Origin") == "Accept-Encoding, Origin"


class _Level:
    priority = 0


def test_the_head_alone_decides_level_backlog_and_model(service: Service) -> None:
    """`admit` (service/admission.py): what `Exchange.admit` and the sync poller (fronts/early.py) both call."""
    level = _Level()
    admitted = admit(service, RequestHead("predict", MODEL, priority="2"), None, level)
    assert (admitted.runtime, admitted.shadow, admitted.priority, level.priority) == (
        service.runtimes[MODEL],
        None,
        2,
        2,
    )
    shed = _Level()
    with pytest.raises(QueueFull):  # past --max-queue requests waiting for a thread: before the model is looked up
        admit(service, RequestHead("predict", "no-such-model", priority="3", backlog=10**6), None, shed)
    assert shed.priority == 3  # written before the refusal, which is counted at it
    with pytest.raises(ClientError, match="X-Priority must be a whole number"):
        admit(service, RequestHead("predict", MODEL, priority="9"), None, _Level())


def test_a_refused_request_takes_no_rate_limit_token() -> None:
    """The rate limit is decided last: a request any other check refuses (415, 413, 404) leaves its token."""
    with echo_service(MODEL, rate_limit=1, rate_burst=1) as limited:
        for head in (
            RequestHead("predict", MODEL, content_type="text/csv"),
            RequestHead("predict", MODEL, content_length=10**9),
            RequestHead("predict", "no-such-model"),
        ):
            with pytest.raises(TwinserveError) as refused:
                admit(limited, head, None, _Level())
            assert refused.value.status in (404, 413, 415)
        admit(limited, RequestHead("predict", MODEL), None, _Level())  # the one token, still there
        with pytest.raises(RateLimited):
            admit(limited, RequestHead("predict", MODEL), None, _Level())


def test_the_moves_are_the_ones_drawn() -> None:
    """The table every check is derived from, as service/lifecycle.py draws it: forward only, then an outcome,
    then CLOSED; a wider table would let a front skip admission or decode twice."""
    open_, admitted, decoded, answered, failed, closed = Stage
    assert {stage: set(moves) for stage, moves in MOVES.items()} == {
        open_: {admitted, answered, failed, closed},
        admitted: {decoded, answered, failed, closed},
        decoded: {answered, failed, closed},
        answered: {answered, failed, closed},
        failed: {failed, closed},
        closed: set(),
    }


def test_a_request_the_server_could_not_parse_is_counted_with_no_model_or_endpoint(
    service: Service, caplog: pytest.LogCaptureFixture
) -> None:
    """The answers a server writes before any route (servers/http1.py: 400, 414, 431) open no exchange: they are
    counted in sums (a flood of them, like a flood of early refusals) and logged in one line an interval."""

    def counted(metric: str, **labels: str) -> float:
        service.counts.flush()  # what a scrape of /metrics does first
        return REGISTRY.get_sample_value(metric, labels) or 0.0

    before = {
        "400": counted("twinserve_requests_total", model="", endpoint="", code="400"),
        "431": counted("twinserve_requests_total", model="", endpoint="", code="431"),
        "malformed_http": counted("twinserve_unparsed_requests_total", reason="malformed_http"),
        "headers_too_large": counted("twinserve_unparsed_requests_total", reason="headers_too_large"),
    }
    with caplog.at_level(logging.WARNING, logger="twinserve.admission"):
        for _ in range(3):
            service.unparsed(MalformedHttp(private="no version"))
        service.unparsed(HeadersTooLarge())
        service.counts.flush()
    assert counted("twinserve_requests_total", model="", endpoint="", code="400") == before["400"] + 3
    assert counted("twinserve_requests_total", model="", endpoint="", code="431") == before["431"] + 1
    assert counted("twinserve_unparsed_requests_total", reason="malformed_http") == before["malformed_http"] + 3
    assert counted("twinserve_unparsed_requests_total", reason="headers_too_large") == before["headers_too_large"] + 1
    # The first after a quiet spell at once; what follows within the interval, in its line (test_refusals.py).
    lines = [r.getMessage() for r in caplog.records if "could not read" in r.getMessage()]
    assert len(lines) == 1 and "(model reason count: - malformed_http " in lines[0], lines
