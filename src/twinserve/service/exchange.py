"""One request's life in one object: `Exchange`, opened by the service, closed exactly once.

Every front (WSGI, ASGI, each WebSocket message) and every endpoint goes through the same steps, in the same
order, whatever the transport:

1. **open** (`Exchange.open`): the request id (the client's, if safe), the request context that model code and log
   lines see, the trace, the in-flight gauge; the `Host` checked (`Service.check_host`, before a preflight);
   `authenticate` when the path needs a key, from the client's address (the auth-failure lockout);
2. **admit**: the one admission decision (service/admission.py), from the head before a byte of the body is read,
   or the sync poller's, taken as made (`RequestHead.decided`);
   a request for a model that is loading (or, under `--max-loaded-models`, not loaded) first waits for it, up to
   that deadline (`wait_admit`, `aadmit`);
3. **decode** the body, its content codings undone (service/compression.py), with the endpoint's codec (V1
   instances or V2 tensors, whose own `timeout` tightens the deadline), and **encode** the outputs into the reply;
4. **reply** or **fail**: one mapping from exception to status, code and body, shaped by the path's protocol
   (`service/routes.py` `ErrorShape`: V1's, V2's or twinserve's); an exception twinserve did not expect is logged
   with its traceback and answered as a bare 500;
5. **close**: the request is logged, counted and traced, and leaves the in-flight gauge, once, whatever happened.
   An exchange closed before it was answered was left by its client: 499.

A front only moves bytes and blocks or awaits; a stream's exchange stays open until its last event, and its first
step is noted here once (`first_step`, the time to first chunk), not by a stage: the stream is answered only when
it ends. The steps are the exchange's `Stage`s (service/lifecycle.py): each step is one move, checked against the
moves its stage allows, so a front cannot decode before it admits, admit twice, or touch an exchange already
closed. Admission reads one `RequestHead`, built by the front once per request from its own headers.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from twinserve.core.memory import release_free_memory
from twinserve.errors import (
    ClientDisconnected,
    MalformedRequest,
    ModelUnavailable,
    TwinserveError,
    UnsupportedMediaType,
    internal_error,
)
from twinserve.repository.shadow import ShadowJob
from twinserve.service.admission import RequestHead, admit, head_level
from twinserve.service.compression import inflate
from twinserve.service.lifecycle import MOVES, IllegalTransition, Stage
from twinserve.service.reply import Reply, error_reply
from twinserve.service.routes import JSON, QUIET_ENDPOINTS, ErrorShape

if TYPE_CHECKING:
    from twinserve.core.runtime import ModelRuntime
    from twinserve.observability.context import RequestContext
    from twinserve.observability.tracing import Headers
    from twinserve.protocol.codecs import ModelCodecs
    from twinserve.protocol.v2 import InferenceRequest
    from twinserve.service.contract import Service

__all__ = [
    "DECODE_OFF_LOOP_BYTES",
    "TRIM_AFTER_BYTES",
    "Exchange",
    "decode_off_loop",
]

logger = logging.getLogger("twinserve.exchange")

T = TypeVar("T")
D = TypeVar("D", bytes, str)

#: Bodies at least this large are decoded on a thread by `adecode`, so that the event loop keeps answering
#: (health checks, other requests) meanwhile: a 64 KiB body takes ~1-3 ms to decode, the hop to a thread ~0.1 ms.
DECODE_OFF_LOOP_BYTES = 64 * 1024
#: A refused body at least this large is followed by a trim of the heap when its exchange closes (core/memory.py):
#: its copies would otherwise stay resident; smaller ones do not move the heap enough to pay for it.
TRIM_AFTER_BYTES = 1 << 20


def _sources(to: Stage) -> frozenset[Stage]:
    """The stages an exchange may move to `to` from (`MOVES`, the one table): checked inline on the hot path."""
    return frozenset(stage for stage, moves in MOVES.items() if to in moves)


_ADMITTED, _DECODED, _ANSWERED = Stage.ADMITTED, Stage.DECODED, Stage.ANSWERED
_MAY_ADMIT, _MAY_DECODE, _MAY_ANSWER = _sources(_ADMITTED), _sources(_DECODED), _sources(_ANSWERED)


#: What `encode_message` records as the answer: a 200 whose body the front builds from the message itself.
_MESSAGE_REPLY = Reply(200, b"")


async def decode_off_loop(decode: Callable[[D], T], data: D) -> T:
    """`decode(data)`, on a thread of the loop's default executor when `data` is large (the request context goes
    with it), in place otherwise."""
    if len(data) < DECODE_OFF_LOOP_BYTES:
        return decode(data)
    return await asyncio.to_thread(decode, data)


class Exchange:
    """One request (or WebSocket message) from its head to its last byte counted."""

    __slots__ = (
        "_body_bytes",
        "_codings",
        "_columnar",
        "_count",
        "_counted",
        "_inference",
        "_instances",
        "_lenient",
        "_shadow",
        "_stepped",
        "_threaded",
        "context",
        "deadline",
        "endpoint",
        "error_code",
        "key_id",
        "model",
        "runtime",
        "service",
        "shape",
        "stage",
        "status",
    )

    @classmethod
    def open(
        cls,
        service: Service,
        endpoint: str,
        method: str,
        path: str,
        headers: Headers | None,
        request_id_header: str | None,
        *,
        model: str = "",
        shape: ErrorShape = "twinserve",
    ) -> Exchange:
        """Open one request's exchange on `service`: it must be closed, exactly once, by its front."""
        return cls(service, service.begin(request_id_header, method, path, headers), endpoint, model, shape)

    def __init__(self, service: Service, context: RequestContext, endpoint: str, model: str, shape: ErrorShape) -> None:
        self.service = service
        self.context = context
        #: The route's name, the `endpoint` label of the request metrics.
        self.endpoint = endpoint
        #: The model named in the path ("" for none); label values a client invents are dropped when counted.
        self.model = model
        #: How its error bodies look: by the path's protocol.
        self.shape: ErrorShape = shape
        # Until answered: an exchange closed unanswered was left by its client.
        self.status: int = ClientDisconnected.status
        self.error_code: str | None = ClientDisconnected.code
        self.runtime: ModelRuntime | None = None
        #: The id of the API key the request presented (None: none, or keys off); set by `authenticate`.
        self.key_id: str | None = None
        #: The request's deadline on the monotonic clock, set by `admit` (None: none).
        self.deadline: float | None = None
        self._inference: InferenceRequest | None = None
        #: The version that computes this request again once it is answered (its model's traffic shadow), and the
        #: instances it is given (None: no shadow).
        self._shadow: ModelRuntime | None = None
        self._instances: list[Any] | None = None
        self._count = 0
        self._body_bytes = 0
        #: The request body's content codings (`Content-Encoding`), undone before it is decoded.
        self._codings: tuple[str, ...] = ()
        #: Whether the body came under a form media type: JSON if it parses, else 415 (`Service.admit`).
        self._lenient = False
        #: Whether a V1 request came columnar (`inputs`): answered with `outputs`.
        self._columnar = False
        #: Whether a request thread took it from a backlog (the sync front): its time feeds the backlog's estimate.
        self._threaded = False
        #: Whether a stream's first step was noted (`first_step`): its time to first step is observed once.
        self._stepped = False
        #: Where it is in its life (service/lifecycle.py); it moves only as `MOVES` allows.
        self.stage = Stage.OPEN
        # Health probes and scrapes are not work: counted, a scrape would read itself, and an HPA scaling on the
        # gauge (docs/scale-out.md) would see a probe's or Prometheus's visit as load.
        self._counted = endpoint not in QUIET_ENDPOINTS
        if self._counted:
            service.sums.opened(service.in_flight)

    @property
    def request_id(self) -> str:
        return self.context.request_id

    def _allowed(self, to: Stage) -> None:
        """Raise IllegalTransition unless the exchange may move to `to` from where it is."""
        if to not in MOVES[self.stage]:
            raise IllegalTransition(self.stage, to)

    def _move(self, to: Stage) -> None:
        self._allowed(to)
        self.stage = to

    @property
    def answered(self) -> bool:
        """Whether an outcome is recorded: an answer, or a failure."""
        return self.stage is Stage.ANSWERED or self.stage is Stage.FAILED

    # -- before the body ---------------------------------------------------------------------------------
    def authenticate(self, headers: Headers, peer: str | None = None) -> str | None:
        """The id of the API key presented, when this path needs one (None otherwise, or with keys off), on a
        connection from `peer` (None: unknown). Raises Unauthorized (401), or RateLimited (429) past the key's
        own limit or with the client's address locked out after too many wrong keys. Before the key, CrossSite
        (403) for what a page on another site sent to a route that changes state (`Service.check_site`)."""
        self.service.check_site(self.endpoint, headers)
        if not self.service.requires_auth(self.context.path):
            return None
        self.key_id = self.service.authenticate(headers, peer)
        return self.key_id

    def wait_admit(self, head: RequestHead) -> ModelRuntime:
        """`admit`, after waiting for a loading model, or loading a cold one, up to the request's deadline (504 past
        it; repository/residency.py): the sync front waits in the request's thread."""
        deadline_of = functools.partial(self.service.admission.deadline, head.timeout)
        self.deadline = self.service.residency.wait(head.model, head.version, deadline_of)
        return self.admit(head)

    async def aadmit(self, head: RequestHead) -> ModelRuntime:
        """`wait_admit` for the event loop."""
        deadline_of = functools.partial(self.service.admission.deadline, head.timeout)
        self.deadline = await self.service.residency.await_ready(head.model, head.version, deadline_of)
        return self.admit(head)

    def admit(self, head: RequestHead) -> ModelRuntime:
        """Admit the request from its head alone (OPEN -> ADMITTED; service/admission.py), unless the sync poller
        admitted it already (`head.decided`, taken as made); the body is read only after this returns. A refusal
        raises and leaves the exchange OPEN, for the front to `fail`."""
        if self.stage not in _MAY_ADMIT:
            raise IllegalTransition(self.stage, _ADMITTED)
        service = self.service
        admitted = head.decided or admit(service, head, self.key_id, self.context, deadline=self.deadline)
        self.context.priority = admitted.priority
        runtime, shadow = admitted.runtime, admitted.shadow
        if head.backlog is not None:
            self._threaded = True
        self.model = runtime.name
        if not runtime.occupancy.enter():
            # Replaced (or unloaded) since it was looked up: it drains the requests inside and takes no more. Its
            # successor, when there is one, takes this request.
            runtime, shadow = service.route(head.endpoint, head.model, head.version, head.headers)
            if not runtime.occupancy.enter():
                raise ModelUnavailable(f"model {runtime.name!r} version {runtime.spec.version} is being unloaded")
            self.context.priority = head_level(service.admission, head, self.key_id, runtime)
        self.runtime = runtime  # from here on, `close` lets it go
        self._shadow = shadow
        self._lenient, self._codings, self.deadline = admitted.lenient, admitted.codings, admitted.deadline
        self.stage = _ADMITTED
        return runtime

    # -- the body ----------------------------------------------------------------------------------------
    def decode(self, body: bytes, header_length: str | None = None) -> list[Any]:
        """The request's instances, with the endpoint's codec (V2: its tensors, and their `timeout`), from `body`
        with its content codings undone (service/compression.py: `--max-body-bytes` bounds the inflated size):
        ADMITTED -> DECODED."""
        if self.stage not in _MAY_DECODE:
            raise IllegalTransition(self.stage, _DECODED)
        try:
            instances = self._decode(body, header_length)
        except MalformedRequest as exc:
            if not self._lenient:
                raise
            raise UnsupportedMediaType(
                f"Content-Type must be {JSON}; the body is not JSON either ({exc.message})"
            ) from None
        self.stage = _DECODED
        return instances

    def _decode(self, body: bytes, header_length: str | None) -> list[Any]:
        service, runtime = self.service, self.runtime
        assert runtime is not None  # ADMITTED (checked by `decode`): admit set it
        codecs = service.codecs_of(runtime)
        if self._codings:
            body = inflate(body, self._codings, service.max_body_bytes, service.too_large)
        self._body_bytes = len(body)
        if self.endpoint == "infer":
            instances = self._inferred(codecs.v2.decode(body, header_length))
        else:
            request = codecs.v1.read(body)
            instances, self._columnar = request.instances, request.columnar
        self._count = len(instances)
        if self._shadow is not None:  # kept for the shadow version, computed once the request is answered
            self._instances = instances
        return instances

    def _inferred(self, inference: InferenceRequest) -> list[Any]:
        """A V2 request's instances; its own `timeout` tightens the deadline, its `priority` sets the level."""
        self._inference = inference
        admission = self.service.admission
        self.deadline = admission.tighten(self.deadline, inference.timeout_us)
        if inference.priority is not None:
            self.context.priority = admission.priority(inference.priority, "parameters.priority", self.key_id)
        return inference.instances

    def decode_message(self, message: Any, binary: bytes) -> list[Any]:
        """`decode` for a V2 request that came as a message, not as body bytes (a gRPC call: its tensors'
        description as the V2 header's object, `binary` their data): decoded by the same V2 codec, without JSON
        in between. ADMITTED -> DECODED."""
        self._allowed(Stage.DECODED)
        self._body_bytes = len(binary)
        instances = self._inferred(self.codecs.v2.decode_message(message, memoryview(binary)))
        self._count = len(instances)
        if self._shadow is not None:
            self._instances = instances
        self.stage = Stage.DECODED
        return instances

    async def adecode_message(self, message: Any, binary: bytes) -> list[Any]:
        """`decode_message` for the event loop: on a thread when its data is large (`decode_off_loop`)."""
        return await decode_off_loop(functools.partial(self.decode_message, message), binary)

    async def adecode(self, body: bytes, header_length: str | None = None) -> list[Any]:
        """`decode` for the event loop: a large body is decoded on a thread (see `decode_off_loop`), and so is a
        compressed one, whose inflated size its length does not tell."""
        decode = functools.partial(self.decode, header_length=header_length)
        if self.coded and len(body) >= DECODE_OFF_LOOP_BYTES // 64:
            return await asyncio.to_thread(decode, body)
        return await decode_off_loop(decode, body)

    def encode(self, outputs: Any) -> Reply:
        """The 200 reply carrying `outputs`, in the protocol the request came in."""
        runtime = self._runtime()
        if self._inference is not None:
            reply = self.reply(self.service.infer_reply(runtime, self._inference, outputs))
        else:
            v1 = self.service.codecs_of(runtime).v1
            reply = self.reply(Reply(200, v1.encode(outputs, self._count, self._columnar)))
        if self._shadow is not None and self._instances is not None:
            self._mirror(runtime, self._shadow, self._instances, outputs)
        return reply

    def encode_message(self, outputs: Any) -> tuple[dict[str, Any], list[bytes]]:
        """`encode` for a V2 request answered as a message, not as body bytes (a gRPC call): the V2 reply's header
        object and its outputs' binary data, no JSON between. -> ANSWERED."""
        runtime, inference = self._runtime(), self._inference
        if inference is None:
            raise RuntimeError("only a decoded V2 request is answered as a message")
        message = self.codecs.v2.encode_message(inference, outputs)
        self.reply(_MESSAGE_REPLY)
        if self._shadow is not None and self._instances is not None:
            self._mirror(runtime, self._shadow, self._instances, outputs)
        return message

    def _mirror(self, runtime: ModelRuntime, shadow: ModelRuntime, instances: list[Any], outputs: Any) -> None:
        """Hand the answered request to its shadow version (repository/shadow.py): never waited for."""
        self._shadow = self._instances = None  # once, however often a front encodes
        seconds = time.perf_counter() - self.context.started
        job = ShadowJob(runtime.name, runtime.spec.version, shadow, instances, outputs, seconds)
        try:
            self.service.shadows.submit(job)
        except Exception:  # the primary's answer is ready: a shadow's trouble is only logged
            logger.exception(
                "model %r: mirroring a request to shadow version %s failed", runtime.name, shadow.spec.version
            )

    @property
    def coded(self) -> bool:
        """Whether the body carries content codings (set by `admit`): its length does not bound what it inflates to."""
        return bool(self._codings)

    @property
    def instances(self) -> int:
        """How many instances the request decoded to."""
        return self._count

    @property
    def codecs(self) -> ModelCodecs:
        """The admitted model's codecs."""
        return self.service.codecs_of(self._runtime())

    def _runtime(self) -> ModelRuntime:
        if self.runtime is None:
            raise RuntimeError("an exchange decodes only after admit")
        return self.runtime

    # -- the answer --------------------------------------------------------------------------------------
    def reply(self, reply: Reply) -> Reply:
        """Record `reply` as the answer (-> ANSWERED) and return it."""
        if self.stage not in _MAY_ANSWER:
            raise IllegalTransition(self.stage, _ANSWERED)
        self.status, self.error_code, self.stage = reply.status, None, _ANSWERED
        return reply

    def responded(self, status: int) -> None:
        """Record the status of a response the front built itself, unless an outcome is recorded already."""
        if not self.answered:
            self._move(Stage.ANSWERED)
            self.status, self.error_code = status, None

    def failed(self, exc: BaseException) -> TwinserveError:
        """Record `exc` as the outcome (-> FAILED) and return it as a TwinserveError (logged when unexpected)."""
        self._allowed(Stage.FAILED)
        if isinstance(exc, TwinserveError):
            error = exc
            if error.private is not None and self.service.expose_errors and self._alone():
                error = error.exposed()
        else:
            logger.exception("unhandled error on %s %s", self.context.method, self.context.path, exc_info=exc)
            error = internal_error(exc)
        self.status, self.error_code, self.stage = error.status, error.code, Stage.FAILED
        return error

    def _alone(self) -> bool:
        """Whether the request was computed in a batch of its own (or failed before batching): only then may a
        model's exception text reach it, since in a shared batch the text may quote another client's input."""
        batch = self.context.batch_size
        return batch is None or batch == self._count

    def counted(self, instances: int) -> None:
        """Note how many instances the admitted request holds, when the front decoded it itself (a WebSocket
        message, whose head is its socket's handshake): ADMITTED -> DECODED."""
        self._move(Stage.DECODED)
        self._count = instances

    def fail(self, exc: BaseException) -> Reply:
        """The error reply for `exc`: its status, code and body, the same in every front."""
        return error_reply(self.failed(exc), self.request_id, self.shape)

    def first_step(self) -> None:
        """Note that a stream's first step is ready: its time to first step (`Service.first_chunk`, by the admitted
        model) is observed now, once, however often a driver says so (service/drive.py). No move: the stream is
        answered when it ends (`succeeded`), or failed."""
        if self._stepped:
            return
        self._stepped = True
        self.service.first_chunk(self.context, self._runtime().name)

    def succeeded(self) -> None:
        """Record a 200 answered piecemeal (a stream that reached its end): -> ANSWERED."""
        self._move(Stage.ANSWERED)
        self.status, self.error_code = 200, None

    def close(self) -> None:
        """Log, count and trace the request and release it from the in-flight gauge: once, whatever happened
        (-> CLOSED; closing again does nothing)."""
        if self.stage is Stage.CLOSED:
            return
        self.stage = Stage.CLOSED
        service = self.service
        if self._threaded and self.status == 200:
            service.admission.served(time.perf_counter() - self.context.started)
        runtime = self.runtime
        writes = None
        try:
            version = runtime.spec.version if runtime is not None else None
            writes = service.finish(self.context, self.endpoint, self.model, self.status, self.error_code, version)
        finally:
            if runtime is not None:
                runtime.occupancy.leave()
            service.sums.ended(writes, service.in_flight if self._counted else None)
            if self._body_bytes >= TRIM_AFTER_BYTES and self.error_code is not None:
                release_free_memory()  # the refused body and what its decoding built are freed by now
