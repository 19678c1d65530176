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


#: A V2 request as a transport frames it (gRPC's `infer_message`): the header's object, and no binary data.
FRAMED: drive.Framed = ({"inputs": [{"name": "input", "datatype": "BYTES", "shape": [2], "data": ['"x"', '"y"']}]}, b"")


def _infer_exchange(service: Service) -> Exchange:
    return Exchange.open(service, "infer", "GRPC", f"/v2/models/{MODEL}/infer", {}, None, model=MODEL)


def _framed(seen: list[Stage], exchange: Exchange) -> drive.Framed:
    """A transport's message step: it sees the exchange admitted, before the message is decoded."""
    seen.append(exchange.stage)
    return FRAMED


async def _apredict_seen(seen: list[Stage], runtime: ModelRuntime, instances: list[Any], deadline: float | None) -> Any:
    return runtime.predict(instances, deadline)


def test_a_framed_message_is_admitted_then_taken_then_decoded_and_answered_as_a_message(service: Service) -> None:
    seen: list[Stage] = []
    exchange = _infer_exchange(service)
    header, data = asyncio.run(
        drive.ainfer_message(exchange, RequestHead("infer", MODEL), seen, _framed, _apredict_seen)
    )
    assert seen == [Stage.ADMITTED] and exchange.stage is Stage.ANSWERED and data == []
    assert [(o["name"], o["data"]) for o in header["outputs"]] == [("output", ['"x"', '"y"'])]
    exchange.close()
    # The stream RPC's two halves: it looks at the admitted model between them.
    split = _infer_exchange(service)

    async def halves() -> drive.Encoded:
        runtime, instances = await drive.adecoded_message(split, RequestHead("infer", MODEL), [], _framed)
        assert (runtime.name, instances, split.stage) == (MODEL, ["x", "y"], Stage.DECODED)
        return await drive.aencoded_message(split, [], runtime, instances, _apredict_seen)

    assert asyncio.run(halves())[0]["outputs"] == header["outputs"]
    split.close()


class _Message:
    """A message that carries its request id, as a WebSocket front's is: the steps record the order they ran in."""

    def __init__(self, service: Service, instances: list[Any] | None) -> None:
        self.service, self.instances = service, instances
        self.steps: list[str] = []
        self.exchange: Exchange | None = None

    async def decode(self) -> list[Any]:
        self.steps.append("decode")
        if self.instances is None:
            raise PayloadTooLarge("refused by its codec")
        return self.instances

    def opened(self) -> Exchange:
        self.steps.append("open")
        self.exchange = _exchange(self.service)
        return self.exchange

    def admit(self, exchange: Exchange) -> ModelRuntime:
        self.steps.append("admit")
        return exchange.admit(RequestHead("predict", MODEL))

    async def predict(self, runtime: ModelRuntime, instances: list[Any], deadline: float | None) -> Any:
        self.steps.append("predict")
        return runtime.predict(instances, deadline)

    def encode(self, exchange: Exchange, outputs: Any) -> bytes:
        self.steps.append("encode")
        return orjson.dumps({"outputs": outputs, "count": exchange.instances})


def _decoded_first(message: _Message) -> bytes:
    return asyncio.run(
        drive.ainfer_decoded_first(
            message, _Message.decode, _Message.opened, _Message.admit, _Message.predict, _Message.encode
        )
    )


def test_a_message_decoded_first_opens_its_exchange_only_once_decoded(service: Service) -> None:
    message = _Message(service, ["x", "y"])
    assert orjson.loads(_decoded_first(message)) == {"outputs": ["x", "y"], "count": 2}
    assert message.steps == ["decode", "open", "admit", "predict", "encode"]
    assert message.exchange is not None and message.exchange.stage is Stage.DECODED  # the front records the answer
    message.exchange.close()
    refused = _Message(service, None)
    with pytest.raises(PayloadTooLarge):
        _decoded_first(refused)
    assert (refused.steps, refused.exchange) == (["decode"], None)  # refused before it was admitted, or opened
