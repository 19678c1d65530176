"""Counting the elements of a JSON body's top-level array before the body is parsed: limits before work.

orjson and pydantic-core build every element before a length limit can look at the list, so a huge body of tiny
elements cost seconds and much memory only to be refused. This scan counts the array under one key from the bytes
alone, with vectorised numpy passes (which release the GIL), building no Python object per element. It never
decides that a body is valid: where it cannot tell, it answers None and the parser decides. Like the parser, it
takes the last of duplicate keys and reads escapes in keys.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import orjson

__all__ = ["count_elements", "exceeds"]

#: Bytes scanned per numpy pass: large enough that numpy's per-call cost vanishes, small enough that the
#: temporary arrays (many times the chunk) stay small whatever the body's size and are reused by the allocator
#: chunk after chunk (much larger chunks left memory resident per thread after a scan).
CHUNK = 1 << 16
#: Structural characters the scan follows at the top level (keys, their colons and commas, each value's brackets);
#: past this many the body has so many top-level keys that walking them in Python costs more than it saves.
MAX_TOP_LEVEL_EVENTS = 4096
#: An escape and the character it escapes: replaced by two neutral bytes (same length, so offsets still hold),
#: after which every remaining `"` opens or closes a string.
_ESCAPE = re.compile(rb"\\[\s\S]")
_WHITESPACE = b" \t\r\n"
_NOT_WHITESPACE = re.compile(rb"[^ \t\r\n]")
_QUOTE, _COMMA, _COLON = ord('"'), ord(","), ord(":")
_OPENS, _CLOSES = b"[{", b"]}"
_STRUCTURAL = (*_OPENS, *_CLOSES, _COMMA, _COLON)


def exceeds(body: bytes, key: str, limit: int) -> bool:
    """Whether the array at `body[key]` surely holds more than `limit` elements (False: the parser decides)."""
    if body.count(b",") < limit:  # n elements need n - 1 commas: a cheap bound that spares the scan most bodies
        return False
    count = count_elements(body, key, limit)
    return count is not None and count > limit


def count_elements(body: bytes, key: str, stop: int | None = None) -> int | None:
    """The number of elements of the array at `body[key]` (`body` a JSON object), or None where the scan cannot
    tell. Counting an array ends at `stop + 1`: past `stop` only whether a later duplicate key replaces it
    matters."""
    start = _skip_whitespace(body, 0)
    if start >= len(body) or body[start] != _OPENS[1]:
        return None
    text = _ESCAPE.sub(b"__", body) if b"\\" in body else body
    scan = _Scan(body, text, key.encode(), stop)
    parity, depth = 0, 0
    for offset in range(0, len(text), CHUNK):
        chunk = np.frombuffer(text, np.uint8, count=min(CHUNK, len(text) - offset), offset=offset)
        # One pass over the bytes finds the quotes and structural bytes; the rest works on those alone, far fewer
        # than the bytes in most bodies (comparisons are cheap in numpy, accumulations over every byte are not).
        marked = chunk == _QUOTE
        for byte in _STRUCTURAL:
            marked |= chunk == byte
        at = np.flatnonzero(marked)
        if not len(at):
            continue
        chars = chunk[at]
        quotes = chars == _QUOTE
        # Inside a string after an odd number of quotes (an opening quote counts as inside, a closing one not):
        # brackets, commas and colons there are text.
        inside = (np.cumsum(quotes, dtype=np.int64) + parity) & 1
        parity = int(inside[-1])
        keep = (inside == 0) & ~quotes
        at, chars = at[keep], chars[keep]
        opens = (chars == _OPENS[0]) | (chars == _OPENS[1])
        closes = (chars == _CLOSES[0]) | (chars == _CLOSES[1])
        level = np.cumsum(opens.astype(np.int64) - closes, dtype=np.int64) + depth  # the depth after each byte
        if len(level):
            depth = int(level[-1])
        commas = chars == _COMMA
        top = ((commas | (chars == _COLON)) & (level == 1)) | (opens & (level <= 2)) | (closes & (level <= 1))
        inner = at[commas & (level == 2)]  # commas between the elements of a top-level value
        if scan.chunk(offset, at[top], level[top], inner, len(chunk)):
            return scan.result()
    return None  # the top-level object never closed: malformed, the parser says how


@dataclass
class _Scan:
    """The walk over the top-level object's events: which key each value belongs to, and the target's count."""

    body: bytes
    text: bytes
    target: bytes
    stop: int | None
    events: int = 0
    key_is_target: bool = False
    open_at: int = -1  # where the target's array opened; -1 while none is open
    commas: int = 0
    count: int | None = None
    failed: bool = False

    def chunk(self, offset: int, events: np.ndarray, levels: np.ndarray, inner: np.ndarray, size: int) -> bool:
        """Walk one chunk's top-level events (positions in the chunk, with the depth after each) and count the
        commas of the target's open array among `inner`; True once the answer is known (the object closed, or the
        scan gave up)."""
        self.events += len(events)
        if self.events > MAX_TOP_LEVEL_EVENTS:
            return self._give_up()
        counted_from = 0  # in the chunk: where commas of the open array are still to be counted
        for index, depth in zip(events.tolist(), levels.tolist(), strict=True):
            at = offset + index
            char = self.text[at]
            if char in _OPENS and depth == 1:
                if at != _skip_whitespace(self.body, 0):  # a second top-level value
                    return self._give_up()
            elif char == _COLON:
                name = self._key_before(at)
                if name is None:
                    return self._give_up()
                self.key_is_target = name == self.target
            elif char == _COMMA:
                self.key_is_target = False
            elif char in _OPENS:  # a value of the top-level object opens
                if self.key_is_target:
                    self.open_at, self.commas, self.count = at, 0, None
                    counted_from = index + 1
                    if char != _OPENS[0]:  # an object, not an array: the parser says what is wrong
                        self.open_at = -1
            elif depth == 1:  # a value of the top-level object closes
                if self.open_at >= 0:
                    self._count_commas(inner, counted_from, index)
                    self._closed(at)
            else:  # the top-level object closes; anything but whitespace after it is the parser's 400
                return True if _NOT_WHITESPACE.search(self.text, at + 1) is None else self._give_up()
        if self.open_at >= 0:
            self._count_commas(inner, counted_from, size)
            if self.stop is not None and self.commas > self.stop and not self._key_may_follow(offset + size):
                self.count = self.stop + 1  # past `stop`, and nothing can replace it: known without reading on
                return True
        return False

    def _key_may_follow(self, start: int) -> bool:
        """Whether the target key may appear again after `start`: spelled as it is, or with an escape."""
        return self.text.find(b'"' + self.target + b'"', start) >= 0 or self.body.find(b"\\", start) >= 0

    def _count_commas(self, inner: np.ndarray, start: int, end: int) -> None:
        if self.stop is None or self.commas <= self.stop:  # past `stop` the exact count no longer matters
            first, last = np.searchsorted(inner, (start, end)).tolist()
            self.commas += last - first

    def _closed(self, at: int) -> None:
        empty = self.commas == 0 and _NOT_WHITESPACE.search(self.text, self.open_at + 1, at) is None
        self.count = 0 if empty else self.commas + 1
        if self.stop is not None:
            self.count = min(self.count, self.stop + 1)
        self.open_at = -1

    def _key_before(self, colon: int) -> bytes | None:
        """The key a top-level colon follows, escapes read; None if no string stands right before it."""
        close = self.text.rfind(b'"', 0, colon)
        if close < 0 or self.text[close + 1 : colon].strip(_WHITESPACE):
            return None
        opening = self.text.rfind(b'"', 0, close)
        if opening < 0:
            return None
        raw = self.body[opening : close + 1]
        if b"\\" not in raw:
            return raw[1:-1]
        try:
            name = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        return name.encode() if isinstance(name, str) else None

    def _give_up(self) -> bool:
        self.failed = True
        return True

    def result(self) -> int | None:
        return None if self.failed else self.count


def _skip_whitespace(body: bytes, at: int) -> int:
    while at < len(body) and body[at] in _WHITESPACE:
        at += 1
    return at
