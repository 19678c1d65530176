"""A request refused before the app, answered as the sync front's werkzeug `Response` writes the app's answer."""

from __future__ import annotations

from werkzeug.http import HTTP_STATUS_CODES
from werkzeug.utils import get_content_type

from twinserve.fronts.early import Refusal
from twinserve.service.routes import REQUEST_ID_HEADER

__all__ = ["front_answer"]


def front_answer(refusal: Refusal) -> tuple[str, list[tuple[str, str]], bytes]:
    """The sync front's answer to a request refused before it (fronts/wsgi.py: the status's upper-case phrase, the
    reply's headers, then content type and length, then the request id), without building a `Response`: under a
    flood this runs for every refused request."""
    reply, request_id = refusal.reply()
    headers = [
        *(reply.headers or {}).items(),
        ("Content-Type", get_content_type(reply.content_type, "utf-8")),
        ("Content-Length", str(len(reply.body))),
        (REQUEST_ID_HEADER, request_id),
    ]
    return f"{reply.status} {HTTP_STATUS_CODES[reply.status].upper()}", headers, reply.body
