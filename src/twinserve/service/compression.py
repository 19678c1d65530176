"""HTTP content codings (RFC 9110 §8.4, §12.5.3): gzip and deflate request bodies in, gzip responses out.

Transport-free, like the rest of the exchange: the fronts hand over header values and bytes.

- A request's `Content-Encoding` is checked from the head (`request_codings`: an unknown coding is 415, as
  RFC 9110 §15.5.16 says), and its body inflated before the codec sees it (`inflate`). `--max-body-bytes` bounds
  the inflated size too, and the bound is kept while inflating (`zlib.decompressobj(...).decompress(data,
  max_length)`): a small "bomb" is refused with 413 after at most `limit + 1` bytes were produced, never inflated
  whole. Triton's client computes `Inference-Header-Content-Length` on the uncompressed body, so it is read
  against the inflated bytes.
- A reply is gzipped (`compress_reply`) when the client's `Accept-Encoding` gives gzip a non-zero q-value and the
  body is at least `GZIP_MIN_BYTES`: below that, the gzip header and the CPU cost more than they save.
  Server-Sent Events never come through here (each event must reach the client when it is written).

Starlette's GZipMiddleware is ASGI's alone and inflates no request; the sync front needs the same answers, so both
fronts call these functions.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from twinserve.errors import ClientError, PayloadTooLarge, UnsupportedMediaType

if TYPE_CHECKING:
    from twinserve.service.reply import Reply

__all__ = ["GZIP_MIN_BYTES", "REQUEST_CODINGS", "accepts_gzip", "compress_reply", "inflate", "request_codings"]

#: The codings a request body may carry, with the zlib window bits that read them. `x-gzip` is gzip's old name,
#: which RFC 9110 §8.4.1.3 says a recipient should treat as gzip; `deflate` is the zlib format (§8.4.1.2).
_GZIP_WBITS = 16 + zlib.MAX_WBITS
REQUEST_CODINGS: dict[str, int] = {"gzip": _GZIP_WBITS, "x-gzip": _GZIP_WBITS, "deflate": zlib.MAX_WBITS}
#: Replies smaller than this are sent as they are, whatever the client accepts.
GZIP_MIN_BYTES = 1024
_GZIP_LEVEL = 6  # zlib's default: most of level 9's gain at a fraction of its time


def request_codings(header: str | None) -> tuple[str, ...]:
    """The codings `Content-Encoding: header` lists, in the order they were applied (identity dropped); raises
    UnsupportedMediaType (415) for one twinserve cannot undo."""
    if not header:
        return ()
    codings = tuple(c for c in (part.strip().lower() for part in header.split(",")) if c and c != "identity")
    for coding in codings:
        if coding not in REQUEST_CODINGS:
            raise UnsupportedMediaType(
                f"Content-Encoding {coding!r} is not supported: send gzip, deflate or identity",
                headers={"Accept-Encoding": "gzip, deflate"},  # RFC 9110 §12.5.3: say which codings would do
            )
    return codings


def inflate(body: bytes, codings: tuple[str, ...], limit: int, too_large: Callable[[], PayloadTooLarge]) -> bytes:
    """`body` with `codings` undone, last applied first; `too_large()` (413) as soon as a stage would produce more
    than `limit` bytes, ClientError (400) for data that is not what its coding says."""
    for coding in reversed(codings):
        body = _inflate_one(body, coding, REQUEST_CODINGS[coding], limit, too_large)
    return body


def _inflate_one(data: bytes, coding: str, wbits: int, limit: int, too_large: Callable[[], PayloadTooLarge]) -> bytes:
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(data, limit + 1)  # one byte past the limit tells "too large" from "just fits"
        if len(out) > limit:
            raise too_large()
        if inflater.unconsumed_tail:  # stopped at max_length exactly at the limit with input left: more to come
            raise too_large()
        out += inflater.flush()
    except zlib.error as exc:
        raise ClientError(f"request body is not valid {coding} data (Content-Encoding): {exc}") from None
    if len(out) > limit:
        raise too_large()
    if not inflater.eof:
        raise ClientError(f"request body is truncated {coding} data (Content-Encoding)")
    if inflater.unused_data:
        raise ClientError(f"request body has data after its {coding} stream (Content-Encoding)")
    return out


def accepts_gzip(header: str | None) -> bool:
    """Whether `Accept-Encoding: header` gives gzip a q-value above 0 (RFC 9110 §12.5.3): by name (or x-gzip),
    else through `*`. No header means no preference, which twinserve reads as identity: many clients that send
    none would not undo a gzip body."""
    if not header:
        return False
    named: float | None = None
    wildcard: float | None = None
    for part in header.split(","):
        coding, _, params = part.partition(";")
        coding = coding.strip().lower()
        quality = _quality(params)
        if coding in ("gzip", "x-gzip"):
            named = quality if named is None else max(named, quality)
        elif coding == "*":
            wildcard = quality
    chosen = named if named is not None else wildcard
    return chosen is not None and chosen > 0


def _quality(params: str) -> float:
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            try:
                return min(max(float(value.strip()), 0.0), 1.0)
            except ValueError:
                return 0.0  # an unreadable weight is not consent
    return 1.0


def compress_reply(reply: Reply, accept_encoding: str | None) -> Reply:
    """`reply`, gzipped when the client accepts gzip and the body is worth it; `Vary: Accept-Encoding` on every
    reply whose body could have been gzipped, so that caches keep both forms apart."""
    if len(reply.body) < GZIP_MIN_BYTES or not reply.content_type:
        return reply
    headers = dict(reply.headers or {})
    if "Content-Encoding" in headers:
        return reply
    headers["Vary"] = "Accept-Encoding"
    if not accepts_gzip(accept_encoding):
        return dataclasses.replace(reply, headers=headers)
    packer = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, _GZIP_WBITS)
    body = packer.compress(reply.body) + packer.flush()
    headers["Content-Encoding"] = "gzip"
    return dataclasses.replace(reply, body=body, headers=headers)
