"""Malformed gRPC messages refused with INVALID_ARGUMENT, and logged in aggregate.

grpcio decodes a request with the deserializer a method handler names; when it raises, grpcio logs the exception
with its traceback ("Exception deserializing request!") and ends the call with INTERNAL, for every message: a
client sending garbage, before it is authenticated, could fill the log. So each
handler's deserializer is wrapped, through grpc.aio's documented server interceptor, to return a `Malformed` marker
instead of raising, and the handler's behaviour to refuse a marked call with INVALID_ARGUMENT: a bad message is the
client's fault, not the server's. The refusals are counted per method and logged as one line per interval
(observability/tally.py), never one per message; the message's bytes and the decoder's text stay out of the log.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from grpc import aio

from twinserve.observability.tally import Tally

__all__ = ["Malformed", "RefuseMalformed"]

logger = logging.getLogger("twinserve.grpc")
INTERVAL_S = 10.0


class Malformed:
    """What a wrapped deserializer returns for bytes that are not the method's message."""

    __slots__ = ()


_MALFORMED = Malformed()


def _log(counts: dict[str, float], seconds: float) -> None:
    detail = ", ".join(f"{method} {n:.0f}" for method, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    logger.warning(
        "refused %d malformed gRPC message(s) in %.1f s with INVALID_ARGUMENT (method count: %s)",
        sum(counts.values()),
        seconds,
        detail,
    )


class RefuseMalformed(aio.ServerInterceptor):  # type: ignore[misc]  # grpc.aio ships no type hints
    """The interceptor (see the module docstring): pass it in `aio.server(interceptors=[...])`."""

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self._tally: Tally[str] = Tally(_log, interval_s)
        #: Each method's wrapped handler, made on its first call (the service's handlers never change).
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        path = str(details.method)
        wrapped = self._wrapped.get(path)
        if wrapped is None:
            wrapped = self._wrap(await continuation(details), path.rsplit("/", 1)[-1])
            if wrapped is not None:  # only the service's methods: a client's made-up names are not kept
                self._wrapped[path] = wrapped
        return wrapped

    def _wrap(self, handler: grpc.RpcMethodHandler | None, method: str) -> grpc.RpcMethodHandler | None:
        if handler is None or handler.request_deserializer is None:
            return handler
        decode = _lenient(handler.request_deserializer)
        serialize = handler.response_serializer
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(self._unary(handler.unary_unary, method), decode, serialize)
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(self._stream(handler.stream_stream, method), decode, serialize)
        return handler  # the service has no other kind of method

    async def _refuse(self, context: Any, method: str) -> None:
        self._tally.add(method)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a valid {method} message")

    def _unary(self, behaviour: Callable[..., Any], method: str) -> Callable[..., Any]:
        async def unary(request: Any, context: Any) -> Any:
            if request is _MALFORMED:
                await self._refuse(context, method)
            return await behaviour(request, context)

        return unary

    def _stream(self, behaviour: Callable[..., AsyncIterator[Any]], method: str) -> Callable[..., Any]:
        refuse = self._refuse

        async def checked(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
            async for request in requests:
                if request is _MALFORMED:
                    await refuse(context, method)
                yield request

        # An async generator function, as the service's own: grpc.aio runs anything else on a thread.
        async def stream(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
            async for response in behaviour(checked(requests, context), context):
                yield response

        return stream


def _lenient(decode: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def lenient(data: bytes) -> Any:
        try:
            return decode(data)
        except Exception:  # protobuf's DecodeError, or anything a decoder raises on foreign bytes
            return _MALFORMED

    return lenient
