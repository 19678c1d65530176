"""The order of an inference request's steps, once, for every front: admit from the head, take the request's
content, decode it, predict, encode. The front gives its own I/O as functions and its own request object
(`source`), which the steps are handed back; the exchange checks each step (service/lifecycle.py).

Three shapes of the same order, by what the transport hands the server:

- a body to read (fronts/asgi.py, fronts/wsgi.py: `ainfer` / `infer`): admit (after waiting for a loading
  model), read the body, decode it with the endpoint's codec, predict, encode the reply. An async twin and a
  blocking one, the same steps;
- a message its transport has already framed (fronts/grpc.py: `ainfer_message`, and `ainfer_messages` for the
  stream RPC): admit at once (a model still loading is refused, not waited for), take the message (the front may
  tighten the deadline by its transport's own here), decode it with the V2 codec without JSON between, predict,
  encode it as a message;
- a message decoded first (fronts/websocket.py: `ainfer_decoded_first`): the request id is inside the message,
  so the message is decoded before its exchange can open, and a message the codec refuses fails before it is
  admitted (nothing charged to the rate limit, no model entered). Then open, admit, predict, encode.

A streaming model (`spec.streams`) takes the same steps up to predict, then its steps instead of one prediction:

- over a body to read (`:stream`: `astreamed` / `streamed`): admit, read, decode, open the model's steps, take
  the first (the async front waits for it only while its client is there, through the function it gives). Errors
  up to the first step are answered like `:predict`'s, with their status and JSON body, and the steps are closed
  here when taking the first one fails. The first step, if any, is noted (`Exchange.first_step`: the time to
  first chunk) and the stream handed back as a `StreamStart`, whose remaining steps the front's event-stream
  writer (fronts/sse.py) writes as they come, then closes, with the exchange;
- as framed messages (gRPC's stream RPC: `ainfer_messages`): one encoded message for a model that does not
  stream, one per step for one that does (each step a slice of `ModelInfer`'s output: one chunk per instance),
  the first step noted as it comes, the exchange answered at the end. The front only sends them, or the failure.

The I/O is passed as module-level functions and the front's own request object, so that driving an HTTP request
allocates nothing of its own.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from twinserve.core.runtime import ModelRuntime
from twinserve.core.streams import AsyncSteps, Steps, step_or_none
from twinserve.service.admission import RequestHead
from twinserve.service.exchange import Exchange
from twinserve.service.lifecycle import BodyRule
from twinserve.service.reply import Reply

__all__ = [
    "Encoded",
    "Framed",
    "Step",
    "StreamStart",
    "adecoded",
    "adecoded_message",
    "aencoded_message",
    "ainfer",
    "ainfer_decoded_first",
    "ainfer_message",
    "ainfer_messages",
    "astreamed",
    "decoded",
    "infer",
    "streamed",
]

S = TypeVar("S")
R = TypeVar("R")
#: A stream's steps: `AsyncSteps` on the event loop, `Steps` in a request thread.
T = TypeVar("T", AsyncSteps, Steps)

#: A V2 request framed by its transport: (the V2 header's object, its tensors' data), as `Exchange.decode_message`
#: reads it.
Framed = tuple[Any, bytes]
#: A V2 reply as a message: (the V2 reply header's object, its outputs' data), as `Exchange.encode_message` gives it.
Encoded = tuple[dict[str, Any], list[bytes]]
#: A step, or None at the stream's end.
Step = list[Any] | None

# The front's I/O, each a function of the front's own request object (`source`, S): reading its body, predicting
# (on the event loop, or blocking in a request thread), taking its framed message.
ABody = Callable[[S, BodyRule], Awaitable[bytes]]
Body = Callable[[S, BodyRule], bytes]
APredict = Callable[[S, ModelRuntime, list[Any], float | None], Awaitable[Any]]
Predict = Callable[[S, ModelRuntime, list[Any], float | None], Any]
Message = Callable[[S, Exchange], Framed]


@dataclass(frozen=True, slots=True)
class StreamStart(Generic[T]):
    """A `:stream` request whose first step is ready, as its front's event-stream writer takes it."""

    #: The admitted model.
    runtime: ModelRuntime
    #: Its steps after the first: the writer steps them, then closes them (and the exchange).
    steps: T
    #: The first step (None: the stream had none).
    first: Step
    #: How many instances each step answers (one chunk each).
    expected: int


# -- a body to read --------------------------------------------------------------------------------------------
async def adecoded(exchange: Exchange, head: RequestHead, source: S, body: ABody[S]) -> tuple[ModelRuntime, list[Any]]:
    """The admitted model and the decoded instances: admit (waiting for a loading model), read, decode."""
    runtime = await exchange.aadmit(head)
    return runtime, await exchange.adecode(await body(source, exchange.service.body), head.header_length)


async def ainfer(
    exchange: Exchange,
    head: RequestHead,
    source: S,
    body: ABody[S],
    predict: APredict[S],
) -> Reply:
    """One inference request on the event loop, from its head to its reply."""
    runtime = await exchange.aadmit(head)
    instances = await exchange.adecode(await body(source, exchange.service.body), head.header_length)
    return exchange.encode(await predict(source, runtime, instances, exchange.deadline))


def decoded(exchange: Exchange, head: RequestHead, source: S, body: Body[S]) -> tuple[ModelRuntime, list[Any]]:
    """`adecoded`, blocking (the sync front's request thread)."""
    runtime = exchange.wait_admit(head)
    return runtime, exchange.decode(body(source, exchange.service.body), head.header_length)


def infer(
    exchange: Exchange,
    head: RequestHead,
    source: S,
    body: Body[S],
    predict: Predict[S],
) -> Reply:
    """`ainfer`, blocking (the sync front's request thread)."""
    runtime = exchange.wait_admit(head)
    instances = exchange.decode(body(source, exchange.service.body), head.header_length)
    return exchange.encode(predict(source, runtime, instances, exchange.deadline))


async def astreamed(
    exchange: Exchange,
    head: RequestHead,
    source: S,
    body: ABody[S],
    wait: Callable[[S, Coroutine[Any, Any, Step]], Awaitable[Step]],
) -> StreamStart[AsyncSteps]:
    """A `:stream` request on the event loop, up to its first step: admit, read, decode, open the model's steps and
    take the first, awaited through `wait` (the async front's: unless the client leaves first)."""
    runtime, instances = await adecoded(exchange, head, source, body)
    steps = await runtime.astream(instances, exchange.deadline)
    try:
        first = await wait(source, step_or_none(steps))
    except BaseException:  # a cancelled wait too (the server stopping): the model's generator must not stay open
        await steps.aclose()
        raise
    if first is not None:  # a stream with no step has no time to its first (as over gRPC)
        exchange.first_step()
    return StreamStart(runtime, steps, first, len(instances))


def streamed(exchange: Exchange, head: RequestHead, source: S, body: Body[S]) -> StreamStart[Steps]:
    """`astreamed`, blocking (the sync front's request thread: its client's leaving shows only as a failed
    write, once the steps are being written)."""
    runtime, instances = decoded(exchange, head, source, body)
    steps = runtime.stream(instances, exchange.deadline)
    try:
        first = next(steps, None)
    except BaseException:
        steps.close()
        raise
    if first is not None:  # a stream with no step has no time to its first (as over gRPC)
        exchange.first_step()
    return StreamStart(runtime, steps, first, len(instances))


# -- a message already framed ------------------------------------------------------------------------------------
async def adecoded_message(
    exchange: Exchange, head: RequestHead, source: S, message: Message[S]
) -> tuple[ModelRuntime, list[Any]]:
    """The admitted model and the decoded instances of a V2 request its transport framed: admit at once, take the
    message (`message` sees the admitted exchange: a transport's own deadline tightens the admitted one there),
    decode it with the V2 codec (on a thread when its data is large)."""
    runtime = exchange.admit(head)
    header, data = message(source, exchange)
    return runtime, await exchange.adecode_message(header, data)


async def aencoded_message(
    exchange: Exchange,
    source: S,
    runtime: ModelRuntime,
    instances: list[Any],
    predict: APredict[S],
) -> Encoded:
    """The rest of `ainfer_message` once decoded: predict, encode the reply as a message."""
    return exchange.encode_message(await predict(source, runtime, instances, exchange.deadline))


async def ainfer_message(
    exchange: Exchange,
    head: RequestHead,
    source: S,
    message: Message[S],
    predict: APredict[S],
) -> Encoded:
    """One inference request its transport framed, from its head to its reply message."""
    runtime, instances = await adecoded_message(exchange, head, source, message)
    return await aencoded_message(exchange, source, runtime, instances, predict)


async def ainfer_messages(
    exchange: Exchange,
    head: RequestHead,
    source: S,
    message: Message[S],
    predict: APredict[S],
    stream: Callable[[S, ModelRuntime, list[Any], float | None], AsyncGenerator[list[Any], None]],
) -> AsyncGenerator[Encoded, None]:
    """The messages answering one request of a stream RPC: `ainfer_message`'s one for a model that does not
    stream; one per step for one that does (`stream` steps it, and closes its steps however it ends), the first
    step noted as it comes, the exchange answered once the steps end. A failure raises, for the front to send."""
    runtime, instances = await adecoded_message(exchange, head, source, message)
    if not runtime.spec.streams:
        yield await aencoded_message(exchange, source, runtime, instances, predict)
        return
    # Closed here however this generator ends: left at a `yield` (its RPC cancelled while a message was being
    # sent), the model's steps would close only once asyncio finalised the generators in turn.
    async with aclosing(stream(source, runtime, instances, exchange.deadline)) as steps:
        async for step in steps:
            exchange.first_step()  # noted once: the later steps' calls do nothing
            # ModelInfer collects a stream: each instance's output is the list of its chunks. A step is then a
            # slice of that output, one chunk per instance, with the tensors ModelMetadata describes.
            yield exchange.encode_message([[chunk] for chunk in step])
    exchange.succeeded()


# -- a message decoded first -------------------------------------------------------------------------------------
async def ainfer_decoded_first(
    source: S,
    decode: Callable[[S], Awaitable[list[Any]]],
    open_exchange: Callable[[S], Exchange],
    admit: Callable[[S, Exchange], ModelRuntime],
    predict: APredict[S],
    encode: Callable[[S, Exchange, Any], R],
) -> R:
    """One message that carries its own request id, from its bytes to its encoded answer: decoded (a refusal
    raises before any exchange exists), its exchange opened (`open_exchange`: the front keeps it, to fail and close
    it), admitted (`admit`: the front's head, and what else its transport charges), its instances counted,
    predicted, encoded."""
    instances = await decode(source)
    exchange = open_exchange(source)
    runtime = admit(source, exchange)
    exchange.counted(len(instances))
    return encode(source, exchange, await predict(source, runtime, instances, exchange.deadline))
