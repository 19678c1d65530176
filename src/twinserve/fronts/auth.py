"""API-key authentication, the same for every front (and for a WebSocket handshake): headers in, key id out.

Keys are compared in constant time: the presented key and every configured key are hashed to fixed-length
digests, and the presented digest is compared with *every* key's, without stopping at a match, so neither the
position of a matching key nor the length of a wrong guess shows in the timing. Keys never reach a log line or
an error message; a key is named by its id, the first 8 hex digits of its SHA-256.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from twinserve.config import Config
from twinserve.errors import Unauthorized
from twinserve.observability.tracing import Headers

__all__ = ["API_KEY_HEADER", "Authenticator", "KeyRing", "authenticator", "credentials_from", "key_id"]

API_KEY_HEADER = "X-API-Key"
#: RFC 6750: a challenge on every 401, with `invalid_token` when a key was presented and refused.
_CHALLENGE = 'Bearer realm="twinserve"'
_INVALID = 'Bearer realm="twinserve", error="invalid_token"'


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def key_id(key: str) -> str:
    """A name for `key` that is safe to log and to label metrics with."""
    return _digest(key).hex()[:8]


def credentials_from(headers: Headers) -> str | None:
    """The key a request presents: `Authorization: Bearer KEY` (scheme case-insensitive) or `X-API-Key: KEY`."""
    authorization = headers.get("authorization")
    if authorization is not None:
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    key = headers.get(API_KEY_HEADER)
    return key.strip() if key is not None and key.strip() else None


class KeyRing:
    """The accepted keys, held only as digests."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._entries = tuple((_digest(k), key_id(k)) for k in dict.fromkeys(keys))
        if not self._entries:
            raise ValueError("a KeyRing needs at least one key")

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(kid for _, kid in self._entries)

    def match(self, presented: str) -> str | None:
        """The id of the key equal to `presented`, or None; the time taken does not depend on which (if any)."""
        digest = _digest(presented)
        found: str | None = None
        for expected, kid in self._entries:
            # No early exit: every key is compared whatever the outcome.
            if hmac.compare_digest(digest, expected) and found is None:
                found = kid
        return found


class Authenticator:
    """Who a request is: a key id, or Unauthorized (401). Each key's rate limit is admission's
    (`core/admission.py`), charged by the service once the key is known."""

    def __init__(self, keys: Iterable[str]) -> None:
        self.keys = KeyRing(keys)

    def authenticate(self, headers: Headers) -> str:
        """The id of the key `headers` present. Raises Unauthorized (missing or unknown key)."""
        presented = credentials_from(headers)
        if presented is None:
            raise Unauthorized(
                f"this endpoint needs an API key: send `Authorization: Bearer <key>` or `{API_KEY_HEADER}: <key>`",
                headers={"WWW-Authenticate": _CHALLENGE},
            )
        kid = self.keys.match(presented)
        if kid is None:
            raise Unauthorized("the API key is not valid", headers={"WWW-Authenticate": _INVALID})
        return kid


def authenticator(config: Config) -> Authenticator | None:
    """The configured authenticator, or None when no API key is set (then nothing is checked)."""
    if not config.auth_enabled:
        return None
    return Authenticator(config.all_api_keys())
