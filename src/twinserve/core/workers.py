"""Model-worker processes for the hybrid architecture: spawn, feed whole batches, replace the dead (S18, S24).

Each worker is a spawned process that imports and loads the model once, then answers one batch at a time over a
pipe. The supervisor side (`ProcessPool`) hands each batch to an idle worker and waits for either its reply or
its death: a worker that dies (OOM kill, segfault, `kill -9`) fails only the batch it held, with a 503, and a
replacement is started in the background while the other workers keep serving.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import queue
import signal
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from twinserve.config import Config
from twinserve.errors import ModelNotReady, TwinserveError, WorkerDied, error_from_code
from twinserve.observability.context import computing, request_ids

__all__ = ["ProcessPool"]

logger = logging.getLogger("twinserve.workers")


@dataclass(frozen=True)
class WorkerReady:
    pid: int


@dataclass(frozen=True)
class BatchReply:
    outputs: list[Any] | None = None
    error_code: str | None = None
    error_message: str | None = None


def _worker_main(target: str, config_json: str, conn: Connection) -> None:
    """Entry point of a model-worker process."""
    import os

    from twinserve.core.hooks import call_blocking, model_code
    from twinserve.model import ModelSpec, import_model
    from twinserve.observability.logging import configure_logging
    from twinserve.observability.metrics import start_memory_sampler

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server process decides when workers stop
    config = Config.model_validate_json(config_json)
    configure_logging(config.log_level, config.log_format)
    start_memory_sampler("model_worker")
    model = import_model(target)()
    model.config = config
    spec = ModelSpec(model)
    if spec.load is not None:
        with model_code(spec.name, "load"):
            call_blocking(spec.load)
    conn.send(WorkerReady(os.getpid()))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        ids, instances = message
        try:
            with computing(ids), model_code(spec.name, "predict"):
                outputs = call_blocking(spec.predict, instances)
            reply = BatchReply(outputs=list(outputs) if not isinstance(outputs, list) else outputs)
        except TwinserveError as exc:
            reply = BatchReply(error_code=exc.code, error_message=exc.message)
        except Exception as exc:  # list() of a non-iterable, say
            reply = BatchReply(error_code="output_mismatch", error_message=f"predict returned {exc}")
        conn.send(reply)


class _Worker:
    def __init__(self, process: BaseProcess, conn: Connection) -> None:
        self.process = process
        self.conn = conn

    @property
    def pid(self) -> int:
        return self.process.pid or -1


class ProcessPool:
    """`size` model-worker processes, each fed one whole batch at a time."""

    def __init__(self, target: str, config: Config, size: int) -> None:
        self.target = target
        self.config = config
        self.size = size
        self._context = multiprocessing.get_context("spawn")  # never fork a process that runs an event loop
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._workers: dict[int, _Worker] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.replaced = 0

    def start(self) -> None:
        """Start every worker and wait until each has loaded the model."""
        for _ in range(self.size):
            self._add(self._spawn())

    def pids(self) -> list[int]:
        with self._lock:
            return sorted(self._workers)

    def call(self, instances: list[Any]) -> list[Any]:
        """Compute one batch on an idle worker (blocking). Raises WorkerDied if the worker dies meanwhile."""
        worker = self._idle.get()
        if worker is None:  # close() woke us up
            raise ModelNotReady("the model-worker pool is shutting down")
        try:
            worker.conn.send((request_ids(), instances))  # the ids go along so the model's logs carry them
            ready = wait([worker.conn, worker.process.sentinel])
            reply: BatchReply = worker.conn.recv() if worker.conn in ready else None  # type: ignore[assignment]
        except (EOFError, OSError):
            reply = None  # type: ignore[assignment]
        if reply is None:
            self._replace(worker)
            raise WorkerDied(f"model worker pid {worker.pid} died while computing this batch; it is being replaced")
        self._idle.put(worker)
        if reply.error_code is not None:
            raise error_from_code(reply.error_code, reply.error_message or "")
        return reply.outputs or []

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers = list(self._workers.values())
            self._workers.clear()
        for worker in workers:
            with contextlib.suppress(OSError):
                worker.conn.send(None)
        for worker in workers:
            worker.process.join(timeout=5)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(timeout=5)
            worker.conn.close()
        for _ in range(self.size):  # release any caller blocked on an idle worker
            self._idle.put(None)  # type: ignore[arg-type]

    def _spawn(self) -> _Worker:
        parent, child = self._context.Pipe()
        process = self._context.Process(
            target=_worker_main,
            args=(self.target, self.config.model_dump_json(), child),
            name="twinserve-model-worker",
            daemon=True,
        )
        process.start()
        child.close()
        ready = wait([parent, process.sentinel])
        message = parent.recv() if parent in ready else None
        if not isinstance(message, WorkerReady):
            process.join(timeout=5)
            raise TwinserveError(f"a model worker for {self.target!r} exited while loading (code {process.exitcode})")
        return _Worker(process, parent)

    def _add(self, worker: _Worker) -> None:
        with self._lock:
            if self._closed:
                worker.conn.send(None)
                return
            self._workers[worker.pid] = worker
        self._idle.put(worker)

    def _replace(self, dead: _Worker) -> None:
        logger.error("model worker pid %d died (exit code %s); starting a replacement", dead.pid, dead.process.exitcode)
        with self._lock:
            self._workers.pop(dead.pid, None)
            if self._closed:
                return
        dead.conn.close()
        self.replaced += 1

        def respawn() -> None:
            try:
                self._add(self._spawn())
            except Exception:
                logger.exception("could not replace model worker pid %d", dead.pid)

        threading.Thread(target=respawn, name="twinserve-respawn", daemon=True).start()
