"""The messages between the server and its model-worker processes (hybrid), and how each crosses the pipe.

Server to worker: `PredictBatch`, `StartStream` / `NextStep` / `CloseStream`, `None` to exit; worker to server:
`BatchReply`, `StepReply`, and once `WorkerReady` or `WorkerFailed`. One message is one frame: pickle protocol 5
with buffers out of band, so a numpy array crosses as its raw bytes rather than copied through the pickle stream.
Plain pydantic models cross as their field values, because pydantic's own pickling is much slower and made the
pipe, not the model, the larger share of a small model's CPU.
"""

from __future__ import annotations

import io
import pickle
import struct
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from pydantic import BaseModel

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


_new = object.__new__
_set = object.__setattr__


def _model(cls: type[BaseModel], values: dict[str, Any], fields_set: set[str]) -> BaseModel:
    """A pydantic model rebuilt from its values, as pydantic's `__setstate__` rebuilds one with no extra fields and
    no private attributes: no validation (it was validated where it was made)."""
    model = _new(cls)
    _set(model, "__dict__", values)
    _set(model, "__pydantic_fields_set__", fields_set)
    _set(model, "__pydantic_extra__", None)
    _set(model, "__pydantic_private__", None)
    return model


#: Per model class: whether it pickles as pydantic's base class does (else its own way is kept).
_PLAIN_PICKLING: dict[type, bool] = {}


def _plain_pickling(cls: type[BaseModel]) -> bool:
    plain = _PLAIN_PICKLING.get(cls)
    if plain is None:
        plain = _PLAIN_PICKLING[cls] = all(
            getattr(cls, name) is getattr(BaseModel, name) for name in ("__getstate__", "__setstate__", "__reduce__")
        ) and getattr(cls, "__reduce_ex__", None) is getattr(BaseModel, "__reduce_ex__", None)
    return plain


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if (
            isinstance(obj, BaseModel)
            and obj.__pydantic_extra__ is None
            and obj.__pydantic_private__ is None
            and _plain_pickling(type(obj))
        ):
            return _model, (type(obj), obj.__dict__, obj.__pydantic_fields_set__)
        return NotImplemented


def encode(message: Any) -> bytes:
    """`message` as one frame."""
    buffers: list[pickle.PickleBuffer] = []
    out = io.BytesIO()
    out.write(_PLAIN)
    _Pickler(out, protocol=5, buffer_callback=buffers.append).dump(message)
    if not buffers:
        return out.getvalue()
    payload = out.getbuffer()[1:]
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
