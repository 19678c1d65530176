"""The model-worker process of the hybrid architecture: it imports and loads the model once, then answers the
server's messages over its pipe until told to stop (core/workers.py is the server's side, `ProcessPool`).

A `PredictBatch` is answered with one `BatchReply`; a `StartStream` holds the worker for one stream, stepped with
`NextStep` until it ends or `CloseStream` closes the model's generator. The messages and their framing are
`twinserve.core.wire`'s. The model's own modules are imported here, in the worker, never in the server process.
"""

from __future__ import annotations

import os
import signal
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from twinserve.config import Config
from twinserve.core import wire
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
from twinserve.errors import TwinserveError
from twinserve.observability.context import computing

if TYPE_CHECKING:
    from twinserve.core.streams import GeneratorSteps
    from twinserve.model import ModelSpec

__all__ = ["model_worker_main"]


def model_worker_main(
    target: str,
    config_json: str,
    conn: Connection,
    module: str | None = None,
    name: str | None = None,
    device: str = "cpu",
) -> None:
    """Entry point of a model-worker process; `device` is `--device` as the server process resolved it."""
    from twinserve.core.device import Placement
    from twinserve.core.heap import settle
    from twinserve.core.hooks import call_blocking, model_code
    from twinserve.core.threads import limit_threads
    from twinserve.model import ModelSpec, import_model
    from twinserve.observability.logging import configure_logging
    from twinserve.observability.metrics import start_memory_sampler

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server process decides when workers stop
    config = Config.model_validate_json(config_json)
    configure_logging(config.log_level, config.log_format)
    start_memory_sampler("model_worker")
    placement = Placement(device)  # this process's one thread: one stream
    try:
        model = import_model(target, module)()
        model.config = config
        model.device = device
        spec = ModelSpec(model)
        if name is not None:  # served under its repository folder's name: the log lines say that one
            spec.name = name
        if spec.load is not None:
            with model_code(spec.name, "load"):
                call_blocking(spec.load)
            placement.loaded()
        limit_threads(config, "process")
        settle()  # the model loaded: the process serves from here (core/heap.py)
    except TwinserveError as exc:  # the server says why its pool could not start (a repository: that model's)
        wire.send(conn, WorkerFailed(exc.code, exc.message, exc.private))
        return
    except Exception as exc:
        wire.send(conn, WorkerFailed("internal", f"{type(exc).__name__}: {exc}"))
        return
    wire.send(conn, WorkerReady(os.getpid()))
    while True:
        try:
            message = wire.recv(conn)
        except (EOFError, OSError):
            return
        if isinstance(message, StartStream):
            if not _serve_stream(conn, spec, message):
                return
            continue
        if not isinstance(message, PredictBatch):
            return  # None: the server is stopping
        try:
            with computing(message.request_ids), placement.computing(), model_code(spec.name, "predict"):
                outputs = call_blocking(spec.predict, message.instances)
            reply = BatchReply(outputs=list(outputs) if not isinstance(outputs, list) else outputs)
        except TwinserveError as exc:
            reply = BatchReply(error_code=exc.code, error_message=exc.message, error_private=exc.private)
        except Exception as exc:  # list() of a non-iterable, say
            reply = BatchReply(error_code="output_mismatch", error_message=f"predict returned {exc}")
        wire.send(conn, reply)


def _serve_stream(conn: Connection, spec: ModelSpec, start: StartStream) -> bool:
    """Step one stream as the server asks; False if the server went away or asked this worker to exit."""
    from twinserve.core.streams import GeneratorSteps

    assert spec.stream is not None
    try:
        with computing(start.request_ids):
            steps: GeneratorSteps | None = GeneratorSteps(spec.stream, start.instances, spec.name)
    except TwinserveError as exc:
        steps = None
        failure = StepReply(done=True, error_code=exc.code, error_message=exc.message, error_private=exc.private)
    while True:
        try:
            message = wire.recv(conn)
        except (EOFError, OSError):
            message = None
        if not isinstance(message, NextStep):  # CloseStream, or None / EOF: the server is stopping
            if steps is not None:
                _close_quietly(steps, start.request_ids)
            return isinstance(message, CloseStream)
        if steps is None:
            wire.send(conn, failure)
            return True
        try:
            with computing(start.request_ids):
                reply = StepReply(chunks=next(steps))
        except StopIteration:
            reply = StepReply(done=True)
        except TwinserveError as exc:
            _close_quietly(steps, start.request_ids)  # a bad step leaves the generator suspended
            reply = StepReply(done=True, error_code=exc.code, error_message=exc.message, error_private=exc.private)
        wire.send(conn, reply)
        if reply.done:
            return True


def _close_quietly(steps: GeneratorSteps, ids: tuple[str, ...]) -> None:
    try:
        with computing(ids):
            steps.close()
    except TwinserveError:
        pass  # model_code logged it; the stream is over either way
