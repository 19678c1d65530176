"""WebSocket stream messages, transport-free: what one message says and how its answer is written.

A stream carries independent requests, each answered when ready (not in order), so every message names itself
with an `id` the answer repeats (`null` when the id cannot be read). Text messages carry the V1 contract
(`{"id", "instances"}` -> `{"id", "predictions"}` or `{"id", "error": {...}}`). Binary messages carry a V2
inference request with Triton's binary tensor data, framed as

    4-byte big-endian unsigned N | N bytes of JSON header | tensor bytes

and are answered in the same frame. Errors have the codes and messages of the HTTP contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ConfigDict, Field, ValidationError, create_model

from twinserve.errors import MalformedRequest, TooManyInstances, TwinserveError, error_payload
from twinserve.protocol.v1 import V1Codec, check_instance_count, dumps, reject_non_json_numbers, request_error
from twinserve.protocol.v2 import InferenceRequest, V2Codec

__all__ = ["FRAME_PREFIX", "BinaryMessage", "MessageError", "TextMessage", "WebSocketCodec"]

#: Bytes of the big-endian JSON-header length that starts every binary message.
FRAME_PREFIX = 4


class MessageError(Exception):
    """A message refused before it reached the model, with the id the answer must repeat (None if unreadable)."""

    def __init__(self, message_id: str | None, error: TwinserveError) -> None:
        super().__init__(error.message)
        self.id = message_id
        self.error = error


@dataclass(frozen=True, slots=True)
class TextMessage:
    id: str | None
    instances: list[Any]


#: Only a message's id: pydantic-core reads past the other keys without building them, so finding the id of a huge
#: message costs a small fraction of the memory a full parse builds.
_MessageId = create_model("MessageId", __config__=ConfigDict(extra="ignore"), id=(Any, None))


def _text_id(text: str | bytes) -> str | None:
    """The message's id when it is readable, for the answer to an invalid message (error path only)."""
    try:
        reject_non_json_numbers(text)  # pydantic-core would read NaN and the like: such a message is unreadable
        value = _MessageId.model_validate_json(text).id  # type: ignore[attr-defined]
    except (MalformedRequest, ValidationError):
        return None
    return value if isinstance(value, str) else None


@dataclass(frozen=True, slots=True)
class BinaryMessage:
    id: str | None
    request: InferenceRequest


def _frame(header: bytes, tensors: bytes = b"") -> bytes:
    return len(header).to_bytes(FRAME_PREFIX, "big") + header + tensors


def _binary_id(frame: bytes) -> str | None:
    if len(frame) < FRAME_PREFIX:
        return None
    length = int.from_bytes(frame[:FRAME_PREFIX], "big")
    return _text_id(frame[FRAME_PREFIX : FRAME_PREFIX + length])


class WebSocketCodec:
    """Decodes one model's stream messages (text: V1, binary: framed V2) and writes their answers."""

    def __init__(self, input_type: Any, v1: V1Codec, v2: V2Codec, max_instances: int | None = None) -> None:
        self._v1 = v1
        self._v2 = v2
        self._max_instances = max_instances
        # The predict request's model plus the id, validated in one pass: instances fail with exactly the
        # messages of the HTTP contract.
        self._message = create_model(
            "StreamMessage",
            __config__=ConfigDict(extra="ignore"),
            instances=(list[input_type], Field(min_length=1, max_length=max_instances)),
            id=(str | None, None),
        )

    @staticmethod
    def message_id(data: str | bytes) -> str | None:
        """A message's id when it can be read, for answers to messages refused unread (error paths only)."""
        return _text_id(data) if isinstance(data, str) else _binary_id(data)

    # -- text: V1 --------------------------------------------------------------------------------------------
    def decode_text(self, text: str) -> TextMessage:
        try:
            reject_non_json_numbers(text)  # NaN, Infinity, 1e400: 400 here as over HTTP
            check_instance_count(text, self._max_instances)  # 413 before the parser builds a single instance
            message: Any = self._message.model_validate_json(text, strict=self._v1.strict)  # as over HTTP
        except (MalformedRequest, TooManyInstances) as exc:
            raise MessageError(_text_id(text), exc) from None
        except ValidationError as exc:
            raise MessageError(_text_id(text), request_error(exc, self._max_instances)) from None
        return TextMessage(message.id, message.instances)

    def encode_text(self, message_id: str | None, outputs: Any, expected: int) -> bytes:
        # The V1 codec checks the outputs and writes `{"predictions": ...}`; the id goes in front of that key.
        body = self._v1.encode(outputs, expected)
        return b'{"id":' + dumps(message_id) + b"," + body[1:]

    @staticmethod
    def text_error(message_id: str | None, error: TwinserveError, request_id: str) -> bytes:
        return dumps({"id": message_id, **error_payload(error, request_id)})

    # -- binary: framed V2 ------------------------------------------------------------------------------------
    def decode_binary(self, frame: bytes) -> BinaryMessage:
        if len(frame) < FRAME_PREFIX:
            raise MessageError(None, MalformedRequest("a binary message starts with the 4-byte length of its header"))
        length = int.from_bytes(frame[:FRAME_PREFIX], "big")
        if length > len(frame) - FRAME_PREFIX:
            error = MalformedRequest(
                f"the binary message's header length {length} exceeds its {len(frame) - FRAME_PREFIX} bytes"
            )
            raise MessageError(None, error)
        try:
            request = self._v2.decode(frame[FRAME_PREFIX:], str(length))
        except TwinserveError as exc:
            raise MessageError(_binary_id(frame), exc) from None
        return BinaryMessage(request.id, request)

    def encode_binary(self, request: InferenceRequest, outputs: Any) -> bytes:
        body, header_length = self._v2.encode(request, outputs)
        if header_length is None:
            return _frame(body)
        return header_length.to_bytes(FRAME_PREFIX, "big") + body

    @staticmethod
    def binary_error(message_id: str | None, error: TwinserveError, request_id: str) -> bytes:
        return _frame(dumps({"id": message_id, **error_payload(error, request_id)}))
