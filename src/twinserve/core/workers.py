"""Model-worker processes for the hybrid architecture: start, feed whole batches, replace the dead (S18, S24).

Each worker imports and loads the model once, then answers one batch at a time over a pipe (core/model_worker.py).
Workers are forked from a fork server that has imported only twinserve's side of a worker, so they start fast and
side by side. `ProcessPool` hands each batch to an idle worker; a worker that dies fails only the batch it held
(503) and is replaced in the background. A stream (`WorkerStream`) holds one worker from start to end. From the
event loop (`acall`) small batches are sent and read on the loop itself, with no thread hand-off; a large frame or
a wait for a worker goes through a thread, so the loop never blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import queue
import threading
import time
from concurrent.futures import Executor
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from twinserve.config import Config
from twinserve.core import wire
from twinserve.core.admission import QueueBound
from twinserve.core.bridge import run_in_executor
from twinserve.core.model_worker import model_worker_main
from twinserve.core.wire import (
    BatchReply,
    CloseStream,
    NextStep,
    PredictBatch,
    StartStream,
    StepReply,
    WorkerFailed,
    WorkerReady,
)
from twinserve.errors import DeadlineExceeded, ModelNotReady, TwinserveError, WorkerDied, error_from_code
from twinserve.observability.context import request_ids
from twinserve.observability.metrics import mark_process_dead, record_death

__all__ = ["ProcessPool", "WorkerStream"]

logger = logging.getLogger("twinserve.workers")

#: A batch frame up to this size is written from the event loop: it fits a Linux pipe's 64 KiB buffer (with the
#: connection's length prefix), which the idle worker has drained, so the write never waits. A larger one is
#: written from a thread.
LOOP_FRAME_BYTES = 65536 - 64

_NEXT_STEP = wire.encode(NextStep())

#: What the fork server imports before forking a worker: `model_worker_main`'s own imports. Not numpy or a model's
#: modules: a math library may start threads as it is imported, and a process with threads must not fork. Forked
#: workers start much faster than spawned ones and share the fork server's pages, which pays for its own memory.
PRELOAD = (
    "twinserve.core.model_worker",
    "twinserve.core.device",
    "twinserve.core.heap",
    "twinserve.core.hooks",
    "twinserve.core.threads",
    "twinserve.model",
    "twinserve.observability.logging",
    "twinserve.observability.metrics",
    "psutil",
)


def _context() -> Any:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))  # read when the fork server starts: on the first worker
    return context


def _outputs(reply: BatchReply) -> list[Any]:
    if reply.error_code is not None:
        raise error_from_code(reply.error_code, reply.error_message or "", reply.error_private)
    return reply.outputs or []


class _Worker:
    def __init__(self, process: BaseProcess, conn: Connection) -> None:
        self.process = process
        self.conn = conn

    @property
    def pid(self) -> int:
        return self.process.pid or -1


class ProcessPool:
    """`size` model-worker processes, each fed one whole batch at a time."""

    def __init__(
        self,
        target: str,
        config: Config,
        size: int,
        module: str | None = None,
        name: str | None = None,
        device: str = "cpu",
    ) -> None:
        self.target = target
        self.module = module
        self.name = name
        self.config = config
        self.device = device
        self._bound = QueueBound(config.max_queue)
        self.size = size
        self._context = _context()  # never fork this process: it runs an event loop and threads
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._workers: dict[int, _Worker] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.replaced = 0
        self._streams_waiting = 0  # instances of streams waiting for a worker (bounded by --max-queue)

    def start(self) -> None:
        """Start every worker and wait until each has loaded the model: side by side, so a pool of N takes about one
        worker's load on N cores. If one fails, the others are stopped and its error is raised."""
        started = [self._start_one() for _ in range(self.size)]
        waited = 0
        try:
            for process, conn in started:
                waited += 1
                self._add(self._ready(process, conn))
        except BaseException:
            for process, conn in started[waited:]:  # those not waited for yet: the one that failed has exited
                process.kill()
                process.join(timeout=5)
                conn.close()
            raise

    def pids(self) -> list[int]:
        with self._lock:
            return sorted(self._workers)

    def call(self, instances: list[Any]) -> list[Any]:
        """Compute one batch on an idle worker (blocking). Raises WorkerDied if the worker dies meanwhile."""
        return _outputs(self._call_frame(wire.encode(PredictBatch(request_ids(), instances))))

    async def acall(self, instances: list[Any], waiters: Executor) -> list[Any]:
        """`call` from the event loop: sent and answered on the loop when a worker is idle and the batch's frame is
        small; else on one of `waiters`' threads (see the module docstring)."""
        frame = wire.encode(PredictBatch(request_ids(), instances))
        worker = self._idle_now() if len(frame) <= LOOP_FRAME_BYTES else None
        if worker is None:
            return _outputs(await run_in_executor(waiters, self._call_frame, frame))
        return _outputs(await self._aexchange(worker, frame))

    def _call_frame(self, frame: bytes) -> BatchReply:
        worker = self._acquire(None)
        reply: BatchReply = self._exchange(worker, frame, "this batch")
        self._idle.put(worker)
        return reply

    def _idle_now(self) -> _Worker | None:
        """An idle worker if one is, without waiting."""
        try:
            worker = self._idle.get_nowait()
        except queue.Empty:
            return None
        if worker is None:  # close() woke us up
            raise ModelNotReady("the model-worker pool is shutting down")
        return worker

    async def _aexchange(self, worker: _Worker, frame: bytes) -> BatchReply:
        """`_exchange` on the loop: the reply is read by the loop when the pipe is readable; the worker's exit makes
        its sentinel readable. The callbacks, not the awaiting task, hand the worker back (or replace it), so a
        cancelled batch still leaves the worker idle once its reply has come."""
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[BatchReply | None] = loop.create_future()
        fd, sentinel = worker.conn.fileno(), worker.process.sentinel
        finished = False

        def finish(reply: BatchReply | None) -> None:
            nonlocal finished
            if finished:
                return
            finished = True
            loop.remove_reader(fd)
            loop.remove_reader(sentinel)
            if reply is None:
                self._replace(worker)
            else:
                self._idle.put(worker)
            if not answered.done():
                answered.set_result(reply)

        def readable() -> None:
            try:
                # uvloop (libuv's poll) made the watched fd non-blocking: a reply longer than one read would be
                # half-read (BlockingIOError) and taken for the worker's death, and the next frame sent (here or
                # from a thread) half-sent. MiniLM's batch of 32 embeddings (49 KB) died so on every other batch.
                # Blocking again before the read, the rest of the reply is waited for, and every later send is
                # whole: an exchange that ends without this read ends with the worker replaced.
                os.set_blocking(fd, True)
                finish(wire.recv(worker.conn))
            except (EOFError, OSError):
                finish(None)
            except Exception as exc:  # a reply that cannot be unpickled here: this batch fails, the worker stays
                finish(BatchReply(error_code="internal", error_message=f"a model worker's reply is unreadable: {exc}"))

        def exited() -> None:
            try:
                replied = worker.conn.poll(0)  # it answered, then exited: the answer stands
            except (EOFError, OSError):
                replied = False
            if replied:
                readable()
            else:
                finish(None)

        try:
            worker.conn.send_bytes(frame)
        except OSError:
            finish(None)
        else:
            loop.add_reader(fd, readable)
            loop.add_reader(sentinel, exited)
        reply = await answered
        if reply is None:
            raise WorkerDied(f"model worker pid {worker.pid} died while computing this batch; it is being replaced")
        return reply

    def stream(self, instances: list[Any], deadline: float | None) -> WorkerStream:
        """A stream of `instances` on the next idle worker; refused (503) while too many streams wait for one."""
        with self._lock:
            waiting = self._streams_waiting
            self._bound.check(waiting, len(instances), f"{waiting} streamed instances already wait for a model worker")
            self._streams_waiting += len(instances)
        return WorkerStream(self, instances, deadline, request_ids())

    def _stream_started(self, instances: list[Any]) -> None:
        with self._lock:
            self._streams_waiting -= len(instances)

    def _acquire(self, deadline: float | None) -> _Worker:
        """An idle worker, waiting at most until `deadline` (504 past it)."""
        try:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            worker = self._idle.get(timeout=timeout)
        except queue.Empty:
            raise DeadlineExceeded("the request's deadline passed while it waited for a model worker") from None
        if worker is None:  # close() woke us up
            raise ModelNotReady("the model-worker pool is shutting down")
        return worker

    def _exchange(self, worker: _Worker, frame: bytes, what: str) -> Any:
        """Send `frame` (a `wire` frame), wait for the reply or the worker's death (WorkerDied, and a replacement
        starts)."""
        try:
            worker.conn.send_bytes(frame)
            ready = wait([worker.conn, worker.process.sentinel])
            reply = wire.recv(worker.conn) if worker.conn in ready else None
        except (EOFError, OSError):
            reply = None
        if reply is None:
            self._replace(worker)
            raise WorkerDied(f"model worker pid {worker.pid} died while computing {what}; it is being replaced")
        return reply

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers = list(self._workers.values())
            self._workers.clear()
        for worker in workers:
            mark_process_dead(worker.pid)  # stopped in order, not a death: its gauges go before it does
            with contextlib.suppress(OSError):
                wire.send(worker.conn, None)
        for worker in workers:
            worker.process.join(timeout=5)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(timeout=5)
            worker.conn.close()
        for _ in range(self.size + self._streams_waiting):  # release any caller blocked on an idle worker
            self._idle.put(None)  # type: ignore[arg-type]

    def _spawn(self) -> _Worker:
        return self._ready(*self._start_one())

    def _start_one(self) -> tuple[BaseProcess, Connection]:
        parent, child = self._context.Pipe()
        process = self._context.Process(
            target=model_worker_main,
            args=(self.target, self.config.model_dump_json(), child, self.module, self.name, self.device),
            name="twinserve-model-worker",
            daemon=True,
        )
        process.start()
        child.close()
        return process, parent

    def _ready(self, process: BaseProcess, parent: Connection) -> _Worker:
        """The worker `process` once it says it has loaded its model; its failure, raised, if it could not."""
        ready = wait([parent, process.sentinel])
        try:
            message = wire.recv(parent) if parent in ready else None
        except EOFError:
            message = None
        if isinstance(message, WorkerFailed):
            process.join(timeout=5)
            raise error_from_code(message.error_code, message.error_message, message.error_private)
        if not isinstance(message, WorkerReady):
            process.join(timeout=5)
            raise TwinserveError(f"a model worker for {self.target!r} exited while loading (code {process.exitcode})")
        return _Worker(process, parent)

    def _add(self, worker: _Worker) -> None:
        with self._lock:
            if self._closed:
                wire.send(worker.conn, None)
                return
            self._workers[worker.pid] = worker
        self._idle.put(worker)

    def _replace(self, dead: _Worker) -> None:
        logger.error("model worker pid %d died (exit code %s); starting a replacement", dead.pid, dead.process.exitcode)
        with self._lock:
            self._workers.pop(dead.pid, None)
            if self._closed:
                return
        record_death(dead.pid)
        dead.conn.close()
        self.replaced += 1

        def respawn() -> None:
            try:
                self._add(self._spawn())
            except Exception:
                logger.exception("could not replace model worker pid %d", dead.pid)

        threading.Thread(target=respawn, name="twinserve-respawn", daemon=True).start()


class WorkerStream:
    """One streaming predict call on a model worker, stepped from threads (blocking); the worker is held until the
    stream ends or is closed, then idle again.

    `start` waits for a worker; `close` may be called while `start` waits (from another thread), never while a
    step is being computed.
    """

    def __init__(self, pool: ProcessPool, instances: list[Any], deadline: float | None, ids: tuple[str, ...]) -> None:
        self._pool = pool
        self._instances = instances
        self._deadline = deadline
        self._ids = ids
        self._lock = threading.Lock()
        self._worker: _Worker | None = None
        self._waiting = True  # counted in the pool's waiting streams
        self._closed = False  # by `close`, or at the stream's end

    def __iter__(self) -> WorkerStream:
        return self

    def start(self) -> None:
        """Wait for an idle worker and start the model's generator there."""
        try:
            worker = self._pool._acquire(self._deadline)
        finally:
            self._stop_waiting()
        with self._lock:
            if self._closed:  # the client left while this waited
                self._pool._idle.put(worker)
                return
            self._worker = worker
            with contextlib.suppress(OSError):  # a dead worker: the first step finds out
                wire.send(worker.conn, StartStream(self._ids, self._instances))

    def _stop_waiting(self) -> None:
        with self._lock:
            waiting, self._waiting = self._waiting, False
        if waiting:
            self._pool._stream_started(self._instances)

    def __next__(self) -> list[Any]:
        if self._worker is None and not self._closed:
            self.start()
        worker = self._worker
        if worker is None:
            raise StopIteration
        try:
            reply: StepReply = self._pool._exchange(worker, _NEXT_STEP, "this stream")
        except WorkerDied:
            self._worker, self._closed = None, True
            raise
        if not reply.done:
            return reply.chunks or []
        self._release()
        if reply.error_code is not None:
            raise error_from_code(reply.error_code, reply.error_message or "", reply.error_private)
        raise StopIteration

    def _release(self) -> None:
        with self._lock:
            worker, self._worker, self._closed = self._worker, None, True
        if worker is not None:
            self._pool._idle.put(worker)

    def close(self) -> None:
        """Stop the stream: the worker closes the model's generator, and is idle again for the next batch."""
        self._stop_waiting()
        with self._lock:
            worker, self._worker = self._worker, None
            self._closed = True
            if worker is None:
                return
            try:
                wire.send(worker.conn, CloseStream())
            except OSError:
                self._pool._replace(worker)
                return
        self._pool._idle.put(worker)
