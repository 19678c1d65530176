"""The one order of an inference request's steps (service/drive.py), driven as a front drives it, with the I/O a
front would give: a body that has arrived, and the model's predict waited for on a thread or in place, or its
steps handed as they come. Over a real `Service` and a loaded model; no socket, no app."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Iterator
from typing import Any

import orjson
import pytest
from prometheus_client import REGISTRY

from tests.unit.service.echo import echo_service
from twinserve.core.runtime import ModelRuntime
from twinserve.errors import ClientDisconnected, PayloadTooLarge
from twinserve.service import drive
from twinserve.service.admission import RequestHead
from twinserve.service.contract import Service
from twinserve.service.exchange import Exchange
from twinserve.service.lifecycle import BodyRule, Stage

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


# -- a streaming model -------------------------------------------------------------------------------------------
STREAM = "drive-stream"


@pytest.fixture(scope="module")
def streaming() -> Iterator[Service]:
    """A streaming model (its first step the instances in upper case, then it raises)."""
    with echo_service(STREAM, model="LeakyStream") as service:
        yield service


class _Steps:
    """A model's steps as a driver is handed them, in both shapes: the step at `fail_at` raises; closing is
    counted, and so is what was taken."""

    def __init__(self, steps: list[list[Any]], fail_at: int | None = None) -> None:
        self._steps, self._fail_at = steps, fail_at
        self.taken = self.closed = 0

    def __iter__(self) -> _Steps:
        return self

    def __next__(self) -> list[Any]:
        if self.taken == self._fail_at:
            raise RuntimeError(f"step {self.taken} failed")
        if self.taken == len(self._steps):
            raise StopIteration
        self.taken += 1
        return self._steps[self.taken - 1]

    def close(self) -> None:
        self.closed += 1

    def __aiter__(self) -> _Steps:
        return self

    async def __anext__(self) -> list[Any]:
        try:
            return next(self)
        except StopIteration:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        self.close()


def _handing(monkeypatch: pytest.MonkeyPatch, service: Service, steps: _Steps) -> None:
    """The streaming model's runtime hands `steps`, in either shape, whatever it is asked."""
    runtime = service.runtimes[STREAM]

    async def astream(instances: list[Any], deadline: float | None = None) -> _Steps:
        return steps

    monkeypatch.setattr(runtime, "stream", lambda instances, deadline=None: steps)
    monkeypatch.setattr(runtime, "astream", astream)


def _stream_exchange(service: Service) -> Exchange:
    return Exchange.open(service, "stream", "POST", f"/v1/models/{STREAM}:stream", {}, None, model=STREAM)


STREAM_BODY = orjson.dumps({"instances": ["x", "y"]})
STREAM_HEAD = RequestHead("stream", STREAM, content_type="application/json", content_length=len(STREAM_BODY))


def _first_chunks() -> float:
    """How many times the streaming model's time to first chunk was observed."""
    return REGISTRY.get_sample_value("twinserve_time_to_first_chunk_seconds_count", {"model": STREAM}) or 0.0


async def _waited(source: list[str], step: Coroutine[Any, Any, drive.Step]) -> drive.Step:
    """The async front's wait on the first step (there: unless the client leaves), recording that it waited."""
    source.append("waited")
    return await step


def test_a_stream_is_driven_to_its_first_step_which_is_noted_once(
    streaming: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _first_chunks()
    blocking = _stream_exchange(streaming)
    start = drive.streamed(blocking, STREAM_HEAD, STREAM_BODY, _arrived)  # the model's own generator
    assert (start.runtime.name, start.first, start.expected) == (STREAM, ["X", "Y"], 2)
    assert blocking.stage is Stage.DECODED  # answered by its writer, once the steps end
    assert _first_chunks() == before + 1
    blocking.first_step()  # said again (a writer, a later step): still observed once
    assert _first_chunks() == before + 1
    start.steps.close()
    blocking.close()

    steps = _Steps([["a", "b"], ["c", "d"]])
    _handing(monkeypatch, streaming, steps)
    awaited, source = _stream_exchange(streaming), ["body"]
    astart = asyncio.run(drive.astreamed(awaited, STREAM_HEAD, source, _source_body, _waited))
    assert (astart.first, astart.expected, astart.steps is steps) == (["a", "b"], 2, True)
    assert (steps.taken, steps.closed, source) == (1, 0, ["body", "waited"])  # the rest is the writer's to step
    assert _first_chunks() == before + 2
    awaited.close()

    _handing(monkeypatch, streaming, _Steps([]))
    empty = _stream_exchange(streaming)
    assert asyncio.run(drive.astreamed(empty, STREAM_HEAD, ["body"], _source_body, _waited)).first is None
    assert _first_chunks() == before + 2  # no step: no time to a first one (as over gRPC)
    empty.close()


async def _source_body(source: list[str], rule: BodyRule) -> bytes:
    return rule.whole(STREAM_BODY)


def test_the_steps_are_closed_when_taking_the_first_one_fails(
    streaming: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _first_chunks()
    steps = _Steps([["a", "b"]], fail_at=0)
    _handing(monkeypatch, streaming, steps)
    blocking = _stream_exchange(streaming)
    with pytest.raises(RuntimeError, match="step 0 failed") as caught:
        drive.streamed(blocking, STREAM_HEAD, STREAM_BODY, _arrived)
    assert steps.closed == 1
    assert blocking.fail(caught.value).status == 500  # answered like :predict's error, by the front
    blocking.close()

    awaited = _stream_exchange(streaming)
    with pytest.raises(RuntimeError, match="step 0 failed"):
        asyncio.run(drive.astreamed(awaited, STREAM_HEAD, ["body"], _source_body, _waited))
    assert steps.closed == 2
    awaited.close()

    async def left(source: list[str], step: Coroutine[Any, Any, drive.Step]) -> drive.Step:
        step.close()  # never awaited: its client left first
        raise ClientDisconnected("gone")

    unanswered = _stream_exchange(streaming)
    with pytest.raises(ClientDisconnected):
        asyncio.run(drive.astreamed(unanswered, STREAM_HEAD, ["body"], _source_body, left))
    assert (steps.closed, steps.taken) == (3, 0)
    unanswered.close()
    assert _first_chunks() == before  # no first step: nothing observed


async def _messages(messages: AsyncIterator[drive.Encoded]) -> list[drive.Encoded]:
    return [message async for message in messages]


def _not_streamed(seen: list[Stage], runtime: ModelRuntime, instances: list[Any], deadline: float | None) -> Any:
    raise AssertionError("a model that does not stream is predicted, not stepped")


def test_a_stream_rpc_answers_one_message_or_one_per_step(streaming: Service, service: Service) -> None:
    single = _infer_exchange(service)
    head = RequestHead("infer", MODEL)
    one = asyncio.run(_messages(drive.ainfer_messages(single, head, [], _framed, _apredict_seen, _not_streamed)))
    assert [[(o["name"], o["data"]) for o in header["outputs"]] for header, _ in one] == [[("output", ['"x"', '"y"'])]]
    assert single.stage is Stage.ANSWERED
    single.close()

    async def stepped(
        seen: list[Stage], runtime: ModelRuntime, instances: list[Any], deadline: float | None
    ) -> AsyncGenerator[list[Any], None]:
        seen.append(exchange.stage)
        for step in (["a", "b"], ["c", "d"], ["e", "f"]):
            yield step

    before = _first_chunks()
    exchange = _stream_rpc_exchange(streaming)
    seen: list[Stage] = []
    head = RequestHead("infer", STREAM)
    steps = asyncio.run(_messages(drive.ainfer_messages(exchange, head, seen, _framed, _apredict_seen, stepped)))
    # Each step a slice of ModelInfer's output: one chunk per instance.
    assert [[(o["shape"], o["data"]) for o in header["outputs"]] for header, _ in steps] == [
        [([2, 1], data)] for data in (["a", "b"], ["c", "d"], ["e", "f"])
    ]
    assert seen == [Stage.ADMITTED, Stage.DECODED]  # taken, then stepped once decoded
    assert (exchange.stage, exchange.status, _first_chunks()) == (Stage.ANSWERED, 200, before + 1)
    exchange.close()


def test_a_stream_rpc_left_after_its_first_message_closes_the_models_steps_at_once(streaming: Service) -> None:
    """The RPC's generator closed at a `yield` (its client cancelled while a message was being sent) closes the
    steps it iterates then, not when the garbage collector finalises them."""
    closed: list[str] = []

    async def endless(
        seen: list[Stage], runtime: ModelRuntime, instances: list[Any], deadline: float | None
    ) -> AsyncGenerator[list[Any], None]:
        try:
            while True:
                yield ["a", "b"]
        finally:
            closed.append("steps")

    async def first_then_leave() -> None:
        exchange = _stream_rpc_exchange(streaming)
        head = RequestHead("infer", STREAM)
        messages = drive.ainfer_messages(exchange, head, [], _framed, _apredict_seen, endless)
        await anext(messages)
        await messages.aclose()
        assert closed == ["steps"]  # now: asyncio would finalise the steps' generator only in a later task
        exchange.close()

    asyncio.run(first_then_leave())


def _stream_rpc_exchange(service: Service) -> Exchange:
    return Exchange.open(service, "infer", "GRPC", f"/v2/models/{STREAM}/infer", {}, None, model=STREAM)
