"""The layers around the async front's app, each installed only when its policy is on: the allowed-hosts check
(service/hosts.py), outermost, and the CORS policy (service/cors.py). Their refusals and a preflight's answer go through
an `Exchange` as any request's do, so they are counted and logged the same way."""

from __future__ import annotations

from collections.abc import Iterable

from starlette.datastructures import Headers as StarletteHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from twinserve.errors import TwinserveError
from twinserve.fronts.asgi_reply import AsgiReply
from twinserve.fronts.websocket import deny_handshake
from twinserve.service.contract import Service
from twinserve.service.cors import merge_vary
from twinserve.service.exchange import Exchange
from twinserve.service.routes import REQUEST_ID_HEADER, error_shape

__all__ = ["CorsMiddleware", "TrustedHostsMiddleware"]


class TrustedHostsMiddleware:
    """The allowed-hosts check (service/hosts.py) on every HTTP request and WebSocket handshake, before anything
    else; only installed when the hosts are restricted."""

    def __init__(self, app: ASGIApp, service: Service) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind in ("http", "websocket"):
            host = _host_header(scope)
            if not self.service.hosts.allows_host(host):
                await self._refuse(scope, receive, send, host)
                return
        await self.app(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, host: str | None) -> None:
        service = self.service
        error = service.hosts.refusal(host)
        if scope["type"] == "websocket":
            await deny_handshake(WebSocket(scope, receive, send), service, error)
            return
        path, headers = scope["path"], StarletteHeaders(scope=scope)
        exchange = Exchange.open(
            service, "unknown", scope["method"], path, headers, headers.get(REQUEST_ID_HEADER), shape=error_shape(path)
        )
        reply = exchange.fail(error)
        exchange.close()
        await AsgiReply(reply, exchange.request_id)(scope, receive, send)


def _merged(headers: Iterable[tuple[bytes, bytes]], extra: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """`headers` and `extra`, one `Vary` naming both's (service/cors.py `merge_vary`)."""
    out = list(headers)
    for name, value in extra:
        at = next((i for i, (n, _) in enumerate(out) if n == b"vary"), None) if name == b"vary" else None
        if at is None:
            out.append((name, value))
        else:
            merged = merge_vary(out[at][1].decode("latin-1"), value.decode("latin-1"))
            out[at] = (name, merged.encode("latin-1"))
    return out


def _host_header(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"host":
            return str(value.decode("latin-1"))
    return None


class CorsMiddleware:
    """The shared CORS policy (service/cors.py) around the whole app: preflights answered
    here, before authentication; the policy's headers added to every other response."""

    def __init__(self, app: ASGIApp, service: Service) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        service = self.service
        headers = StarletteHeaders(scope=scope)
        if service.is_preflight(scope["method"], headers):
            path = scope["path"]
            exchange = Exchange.open(
                service,
                "preflight",
                scope["method"],
                path,
                headers,
                headers.get(REQUEST_ID_HEADER),
                shape=error_shape(path),
            )
            try:
                reply = exchange.reply(service.preflight(headers))
            except TwinserveError as exc:
                reply = exchange.fail(exc)
            exchange.close()
            await AsgiReply(reply, exchange.request_id)(scope, receive, send)
            return
        assert service.cors is not None
        extra = [
            (name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in service.cors.response_headers(headers.get("origin")).items()
        ]
        if not extra:
            await self.app(scope, receive, send)
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": _merged(message.get("headers", ()), extra)}
            await send(message)

        await self.app(scope, receive, send_with_cors)
