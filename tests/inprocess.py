"""The real apps, built in this process exactly as the servers build them, behind one small synchronous client.

sync: `twinserve.servers.sync.server.build_wsgi_app(Served(config))` (what each gunicorn worker loads), driven by
Flask's test client. async and hybrid: `twinserve.servers.asgi.server.AppFactory(Served(config))()` (what uvicorn
calls), driven by httpx's ASGITransport on an event loop of its own thread, the way uvicorn keeps one loop for the
app's whole life. httpx does not run the ASGI lifespan, so `_Lifespan` does: models load at
startup (hybrid: the model-worker processes are spawned there) and close at shutdown.

No socket and no subprocess, so each request costs microseconds to milliseconds; what only a real HTTP server
does (gunicorn's and httptools' parsing limits, connection handling, signals, several server processes) stays
with the real-socket suites (`tests/serving.py`).

Three things the servers do are left out on purpose, because they outlive the app in a test process:
`start_memory_sampler` (a thread that never ends, and that reaps the live-gauge files of whatever metrics
directory the environment names, racing tests that set one), the heap's freeze once the models have loaded
(core/heap.py: whatever the test process holds then would never be collected) and uvicorn's signal handlers
(which `AppFactory` installs only inside a running loop, so they are skipped here by construction).
prometheus-client is used in-memory here (no PROMETHEUS_MULTIPROC_DIR): `/metrics` then renders this process's
own registry, as `twinserve.observability.metrics._registry` documents for in-process use.
"""

from __future__ import annotations

import asyncio
import json as jsonlib
import threading
from collections.abc import Coroutine, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar
from unittest import mock

import httpx

from twinserve.config import Config, load_config
from twinserve.repository import ModelRegistry

T = TypeVar("T")
ARCHS_IN_PROCESS = ("sync", "async", "hybrid")
STARTUP_TIMEOUT = 120.0
REQUEST_TIMEOUT = 60.0


@dataclass(frozen=True)
class Answer:
    """One response: status, headers (lower-case names), and the whole body."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return jsonlib.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")


class Client(Protocol):
    arch: str
    config: Config

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Answer: ...


def _body(json: Any, content: bytes | None, headers: Mapping[str, str] | None) -> tuple[bytes | None, dict[str, str]]:
    """The request body and headers, encoded the same way for both clients (JSON as httpx sends it)."""
    sent = dict(headers or {})
    if json is not None:
        assert content is None, "json or content, not both"
        content = jsonlib.dumps(json).encode()
        if not any(name.lower() == "content-type" for name in sent):
            sent["Content-Type"] = "application/json"
    return content, sent


class SyncClient:
    """The WSGI app gunicorn would serve, called through werkzeug's test client."""

    def __init__(self, config: Config) -> None:
        from twinserve.servers.served import Served
        from twinserve.servers.sync import server

        self.arch = "sync"
        self.config = config
        self.registry: ModelRegistry | None = None

        def load_models(config: Config) -> ModelRegistry:
            self.registry = ModelRegistry.from_config(config)  # kept, to close its models when the test is done
            return self.registry

        with (
            mock.patch.object(server, "start_memory_sampler"),
            mock.patch.object(server, "load_models", load_models),
        ):
            self.app = server.build_wsgi_app(Served(config))
        self.client = self.app.test_client()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        data, sent = _body(json, content, headers)
        response = self.client.open(path, method=method, data=data, headers=sent)
        try:
            body = response.get_data()
            return Answer(response.status_code, {k.lower(): v for k, v in response.headers.items()}, body)
        finally:
            response.close()  # a streamed body's generator ends here, as when gunicorn finishes the response

    def close(self) -> None:
        if self.registry is not None:  # gunicorn's worker exits instead; a test process goes on
            self.registry.close()


class _Lifespan:
    """The ASGI lifespan protocol, driven as uvicorn drives it: startup before any request, shutdown at the end."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.stopped: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.task: asyncio.Task[None] | None = None

    async def _receive(self) -> dict[str, Any]:
        return await self.inbox.get()

    async def _send(self, message: Mapping[str, Any]) -> None:
        kind = message["type"]
        if kind == "lifespan.startup.complete":
            self.started.set_result(None)
        elif kind == "lifespan.startup.failed":
            self.started.set_exception(RuntimeError(f"lifespan startup failed: {message.get('message', '')}"))
        elif kind == "lifespan.shutdown.complete":
            self.stopped.set_result(None)
        elif kind == "lifespan.shutdown.failed":
            self.stopped.set_exception(RuntimeError(f"lifespan shutdown failed: {message.get('message', '')}"))

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
        try:
            await self.app(scope, self._receive, self._send)
        except Exception as exc:  # reported to whoever waits for the phase it broke, not raised a second time
            waiting = self.started if not self.started.done() else self.stopped
            if not waiting.done():
                waiting.set_exception(RuntimeError(f"lifespan raised {exc!r}"))

    async def startup(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())
        await self.inbox.put({"type": "lifespan.startup"})
        await self.started

    async def shutdown(self) -> None:
        await self.inbox.put({"type": "lifespan.shutdown"})
        await self.stopped
        assert self.task is not None
        await self.task


class AsyncClient:
    """The ASGI app uvicorn would serve (async, or hybrid with its model-worker processes), on a loop thread."""

    def __init__(self, config: Config) -> None:
        from twinserve.servers.asgi import server
        from twinserve.servers.served import Served

        self.arch = config.arch
        self.config = config
        with (
            mock.patch.object(server, "start_memory_sampler"),
            mock.patch.object(server, "settle"),
        ):
            self.app = server.AppFactory(Served(config))()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=f"inprocess-{self.arch}-loop", daemon=True)
        self.thread.start()
        self.client: httpx.AsyncClient | None = None
        self.lifespan: _Lifespan | None = None
        try:
            self._call(self._start(), STARTUP_TIMEOUT)
        except BaseException:
            self._stop_loop()
            raise

    async def _start(self) -> None:
        self.lifespan = _Lifespan(self.app)
        await self.lifespan.startup()
        transport = httpx.ASGITransport(app=self.app)
        # `Host: localhost`, as werkzeug's test client sends: a host the default (loopback) --allowed-hosts serve.
        self.client = httpx.AsyncClient(transport=transport, base_url="http://localhost", timeout=REQUEST_TIMEOUT)

    def _call(self, work: Coroutine[Any, Any, T], timeout: float = REQUEST_TIMEOUT) -> T:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(timeout)

    async def _request(self, method: str, path: str, data: bytes | None, headers: dict[str, str]) -> Answer:
        assert self.client is not None
        response = await self.client.request(method, path, content=data, headers=headers)
        return Answer(response.status_code, {k.lower(): v for k, v in response.headers.items()}, response.content)

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        data, sent = _body(json, content, headers)
        return self._call(self._request(method, path, data, sent))

    async def _close(self) -> None:
        if self.client is not None:
            await self.client.aclose()
        if self.lifespan is not None:
            await self.lifespan.shutdown()

    def close(self) -> None:
        try:
            self._call(self._close(), STARTUP_TIMEOUT)
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        if not self.thread.is_alive():
            self.loop.close()


def build(arch: str, models: list[str] | tuple[str, ...], **overrides: Any) -> SyncClient | AsyncClient:
    """The app `twinserve serve MODELS --arch ARCH --flag value ...` would serve, built in this process."""
    named: dict[str, Any] = {"models": list(models)} if models else {}  # none: a --model-repository names them
    config = load_config(**named, arch=arch, **overrides)
    return SyncClient(config) if arch == "sync" else AsyncClient(config)


@contextmanager
def served_per_arch(
    models: list[str] | tuple[str, ...], **overrides: Any
) -> Iterator[dict[str, SyncClient | AsyncClient]]:
    """One app per architecture, same models and settings (a module's fixture), all closed on the way out."""
    built: dict[str, SyncClient | AsyncClient] = {}
    try:
        for arch in ARCHS_IN_PROCESS:
            built[arch] = build(arch, models, **overrides)
        yield built
    finally:
        for client in built.values():
            client.close()


@contextmanager
def served(arch: str, models: list[str] | tuple[str, ...], **overrides: Any) -> Iterator[SyncClient | AsyncClient]:
    """`build(...)`, closed on the way out (async: lifespan shutdown, which also stops hybrid's model workers)."""
    client = build(arch, models, **overrides)
    try:
        yield client
    finally:
        client.close()
