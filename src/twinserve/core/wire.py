"""The messages between the server and its model-worker processes (hybrid), and how each crosses the pipe.

Server to worker: `PredictBatch` (reply `BatchReply`), `StartStream` then `NextStep`s (each replied by a
`StepReply`) until the stream ends or the server sends `CloseStream` (no reply), `None` to exit. Worker to server,
once: `WorkerReady`, or `WorkerFailed` when the model cannot be imported or loaded.

One message is one frame on the pipe (`send` / `recv`): pickle protocol 5 with its buffers out of band, so a
numpy array (or anything else that pickles through `PickleBuffer`) crosses as its raw bytes appended to the frame
instead of being copied into the pickle stream and out again; a message without such buffers is a plain pickle.
The receiver gets each array back writable, in a buffer of its own, as an in-band pickle would have given it.
"""

from __future__ import annotations

import pickle
import struct
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

__all__ = [
    "BatchReply",
    "CloseStream",
    "NextStep",
    "PredictBatch",
    "StartStream",
    "StepReply",
    "WorkerFailed",
    "WorkerReady",
    "decode",
    "encode",
    "recv",
    "send",
]


@dataclass(frozen=True, slots=True)
class WorkerReady:
    pid: int


@dataclass(frozen=True, slots=True)
class WorkerFailed:
    """The model failed to import or load in the worker: the pool's start raises this error."""

    error_code: str
    error_message: str
    error_private: str | None = None


@dataclass(frozen=True, slots=True)
class PredictBatch:
    request_ids: tuple[str, ...]  # the model's log lines carry them
    instances: list[Any]


@dataclass(frozen=True, slots=True)
class BatchReply:
    outputs: list[Any] | None = None
    error_code: str | None = None
    error_message: str | None = None
    error_private: str | None = None


@dataclass(frozen=True, slots=True)
class StartStream:
    request_ids: tuple[str, ...]
    instances: list[Any]


@dataclass(frozen=True, slots=True)
class NextStep:
    pass


@dataclass(frozen=True, slots=True)
class CloseStream:
    pass


@dataclass(frozen=True, slots=True)
class StepReply:
    """One step's chunks; or the stream's end (`done`), normal or with an error. The worker is then idle."""

    chunks: list[Any] | None = None
    done: bool = False
    error_code: str | None = None
    error_message: str | None = None
    error_private: str | None = None


# A frame: one tag byte, then either the pickle (PLAIN) or (OUT_OF_BAND) the buffer count, the pickle's length,
# each buffer's length, the pickle, the buffers.
_PLAIN = b"\x00"
_OUT_OF_BAND = b"\x01"
_COUNTS = struct.Struct("<II")


def encode(message: Any) -> bytes:
    """`message` as one frame."""
    buffers: list[pickle.PickleBuffer] = []
    payload = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    if not buffers:
        return _PLAIN + payload
    raws = [buffer.raw() for buffer in buffers]  # contiguous by construction (PickleBuffer of a C/F array)
    sizes = struct.pack(f"<{len(raws)}Q", *(raw.nbytes for raw in raws))
    return b"".join([_OUT_OF_BAND, _COUNTS.pack(len(raws), len(payload)), sizes, payload, *raws])


def decode(frame: bytes) -> Any:
    """The message in one frame (see `encode`)."""
    view = memoryview(frame)
    if view[:1] == _PLAIN:
        return pickle.loads(view[1:])
    count, length = _COUNTS.unpack_from(view, 1)
    start = 1 + _COUNTS.size
    sizes = struct.unpack_from(f"<{count}Q", view, start)
    start += 8 * count
    payload = view[start : start + length]
    start += length
    buffers = []
    for size in sizes:
        buffers.append(bytearray(view[start : start + size]))  # writable and its own, as an in-band pickle gives
        start += size
    return pickle.loads(payload, buffers=buffers)


def send(conn: Connection, message: Any) -> None:
    """Send `message` as one frame (blocking while the pipe is full)."""
    conn.send_bytes(encode(message))


def recv(conn: Connection) -> Any:
    """The next message (blocking); EOFError when the other end has closed."""
    return decode(conn.recv_bytes())
