"""The one response writer (service/response.py): header fields in one order, and whole HTTP/1.1 responses."""

from __future__ import annotations

import pytest

from twinserve.service.reply import Reply
from twinserve.service.response import header_fields, http1_response


def test_the_fields_come_in_one_order() -> None:
    reply = Reply(200, b'{"live":true}', {"Retry-After": "1"})
    assert header_fields(reply, "id-1") == [
        (b"x-request-id", b"id-1"),
        (b"retry-after", b"1"),
        (b"content-length", b"13"),
        (b"content-type", b"application/json"),
    ]


@pytest.mark.parametrize("status", [101, 204, 304])
def test_no_content_length_where_rfc_9110_forbids_one(status: int) -> None:
    """RFC 9110 section 8.6: no Content-Length on a 1xx or a 204; a 304's would describe the body it omits."""
    fields = dict(header_fields(Reply(status, b"", content_type=""), "id"))
    assert b"content-length" not in fields and b"content-type" not in fields


def test_a_streamed_body_has_no_length_and_its_own_content_type_is_kept_as_written() -> None:
    """An event stream's head (fronts/sse.py): the server frames its parts; the type it names itself gains no
    charset, as Flask sends it in sync."""
    head = Reply(200, b"", {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}, content_type="")
    assert header_fields(head, "id", streamed=True) == [
        (b"x-request-id", b"id"),
        (b"content-type", b"text/event-stream"),
        (b"cache-control", b"no-cache"),
    ]


def test_a_text_type_names_its_charset() -> None:
    assert (b"content-type", b"text/plain; charset=utf-8") in header_fields(Reply(200, b"ok", None, "text/plain"), "i")


def test_a_whole_response_with_the_servers_fields_first() -> None:
    raw = http1_response(Reply(404, b"{}"), "id", [(b"server", b"uvicorn")])
    assert raw == (
        b"HTTP/1.1 404 Not Found\r\nserver: uvicorn\r\nx-request-id: id\r\ncontent-length: 2\r\n"
        b"content-type: application/json\r\nconnection: close\r\n\r\n{}"
    )
