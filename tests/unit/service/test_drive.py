"""The one order of an inference request's steps (service/drive.py), driven as a front drives it, with the I/O a
front would give: a body that has arrived, and the model's predict waited for on a thread or in place. Over a real
`Service` and a loaded model; no socket, no app."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from tests.unit.service.echo import echo_service
from twinserve.core.runtime import ModelRuntime
from twinserve.errors import PayloadTooLarge
from twinserve.service import drive
from twinserve.service.contract import Service
from twinserve.service.exchange import Exchange
from twinserve.service.lifecycle import BodyRule, RequestHead, Stage

MODEL = "drive-echo"


@pytest.fixture(scope="module")
def service() -> Iterator[Service]:
    with echo_service(MODEL, max_body_bytes=100) as service:
        yield service


def _exchange(service: Service) -> Exchange:
    return Exchange.open(service, "predict", "POST", f"/v1/models/{MODEL}:predict", {}, None, model=MODEL)


def _head(body: bytes) -> RequestHead:
    return RequestHead("predict", MODEL, content_type="application/json", content_length=len(body))


def _arrived(body: bytes, rule: BodyRule) -> bytes:
    """A front's body read: here, one that had all arrived."""
    return rule.whole(body)


async def _aarrived(body: bytes, rule: BodyRule) -> bytes:
    return rule.whole(body)


def _predict(source: bytes, runtime: ModelRuntime, instances: list[Any], deadline: float | None) -> Any:
    return runtime.predict(instances, deadline)


async def _apredict(source: bytes, runtime: ModelRuntime, instances: list[Any], deadline: float | None) -> Any:
    return await asyncio.to_thread(runtime.predict, instances, deadline)


def test_blocking_and_async_drivers_take_a_request_from_its_head_to_its_reply(service: Service) -> None:
    body = orjson.dumps({"instances": ["x", "y"]})
    blocking = _exchange(service)
    reply = drive.infer(blocking, _head(body), body, _arrived, _predict)
    awaited = _exchange(service)
    areply = asyncio.run(drive.ainfer(awaited, _head(body), body, _aarrived, _apredict))
    for exchange, answer in ((blocking, reply), (awaited, areply)):
        assert exchange.stage is Stage.ANSWERED
        assert (answer.status, orjson.loads(answer.body)) == (200, {"predictions": ["x", "y"]})
        exchange.close()


def test_the_decoding_drivers_stop_before_predict_and_a_refused_body_stops_them(service: Service) -> None:
    body = orjson.dumps({"instances": ["x"]})
    exchange = _exchange(service)
    runtime, instances = drive.decoded(exchange, _head(body), body, _arrived)
    assert (runtime.name, instances, exchange.stage) == (MODEL, ["x"], Stage.DECODED)
    exchange.close()
    large = orjson.dumps({"instances": ["x" * 200]})
    refused = _exchange(service)
    with pytest.raises(PayloadTooLarge):  # chunked, say: no length declared, the body rule judges what arrived
        asyncio.run(drive.adecoded(refused, RequestHead("predict", MODEL), large, _aarrived))
    assert refused.stage is Stage.ADMITTED  # admitted from its head; its body never decoded
    assert refused.fail(PayloadTooLarge("too large")).status == 413
    refused.close()
