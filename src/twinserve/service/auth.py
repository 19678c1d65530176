"""API-key authentication, the same for every front (and for a WebSocket handshake): headers in, key id out.

Keys are compared in constant time: the presented key and every configured key are hashed to fixed-length
digests, and the presented digest is compared with *every* key's, without stopping at a match, so neither the
position of a matching key nor the length of a wrong guess shows in the timing. Keys never reach a log line or
an error message; a key is named by its id, the first 8 hex digits of its SHA-256.

Guessing is bounded per client address (`core/lockout.py`, `--auth-failures-per-minute`): past the limit of
wrong keys, the address gets 429 + Retry-After for a minute before any key is compared. Only a wrong key counts;
a missing one guesses nothing. Failures are logged in aggregate, one line a minute at most, never one per guess.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
from collections.abc import Iterable

from twinserve.config import MIN_API_KEY_LENGTH, Config
from twinserve.core.lockout import FailureLockout
from twinserve.errors import RateLimited, Unauthorized
from twinserve.observability.tracing import Headers

__all__ = ["API_KEY_HEADER", "Authenticator", "KeyRing", "authenticator", "credentials_from", "key_id"]

API_KEY_HEADER = "X-API-Key"
_API_KEY = API_KEY_HEADER.lower()  # looked up in lower case: a plain dict of the request's headers holds them so
#: RFC 6750: a challenge on every 401, with `invalid_token` when a key was presented and refused.
_CHALLENGE = 'Bearer realm="twinserve"'
_INVALID = 'Bearer realm="twinserve", error="invalid_token"'
#: The lockout's window: `--auth-failures-per-minute` failures within it lock an address out for as long.
LOCKOUT_WINDOW_S = 60.0

logger = logging.getLogger("twinserve.auth")


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
    key = headers.get(_API_KEY)
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

    def __init__(
        self,
        keys: Iterable[str],
        *,
        lockout: FailureLockout | None = None,
    ) -> None:
        self.keys = KeyRing(keys)
        #: Wrong keys per client address (None: unbounded guessing, `--auth-failures-per-minute 0`).
        self.lockout = lockout

    def authenticate(self, headers: Headers, client: str | None = None) -> str:
        """The id of the key `headers` present, for a request from address `client` (None: unknown, then never
        locked out). Raises Unauthorized (missing or unknown key) or RateLimited (`client` locked out after too
        many wrong keys); the key's own rate limit is admission's, charged by the service."""
        lockout = self.lockout
        if lockout is not None and client is not None:
            remaining = lockout.locked(client)
            if remaining is not None:
                self._log_failures(lockout)
                raise RateLimited(
                    "too many wrong API keys from this address: every request from it is refused for a while "
                    "(--auth-failures-per-minute)",
                    headers={"Retry-After": str(max(1, math.ceil(remaining)))},
                )
        presented = credentials_from(headers)
        if presented is None:
            raise Unauthorized(
                f"this endpoint needs an API key: send `Authorization: Bearer <key>` or `{API_KEY_HEADER}: <key>`",
                headers={"WWW-Authenticate": _CHALLENGE},
            )
        kid = self.keys.match(presented)
        if kid is None:
            if lockout is not None and client is not None:
                lockout.failed(client)
                self._log_failures(lockout)
            raise Unauthorized("the API key is not valid", headers={"WWW-Authenticate": _INVALID})
        if lockout is not None:
            self._log_failures(lockout)  # what an interval that ended quietly left unreported
        return kid

    @staticmethod
    def _log_failures(lockout: FailureLockout) -> None:
        report = lockout.report()
        if report is not None:
            logger.warning(
                "authentication failures: %d wrong API key(s) from %d address(es) in %.0f s; %d address(es) "
                "locked out, %d request(s) refused while locked out; most: %s",
                report.failures,
                report.addresses,
                report.seconds,
                report.locked_out,
                report.refused,
                ", ".join(f"{address} ({count})" for address, count in report.top) or "-",
            )


def authenticator(config: Config) -> Authenticator | None:
    """The configured authenticator, or None when no API key is set (then nothing is checked)."""
    if not config.auth_enabled:
        return None
    keys = config.all_api_keys()
    short = sum(len(key) < MIN_API_KEY_LENGTH for key in keys)
    if short:  # only with --allow-short-api-keys: Config refuses them otherwise
        logger.warning(
            "%d API key(s) shorter than %d characters accepted (--allow-short-api-keys): they can be guessed",
            short,
            MIN_API_KEY_LENGTH,
        )
    lockout = None
    if config.auth_failures_per_minute:
        # Split over the server processes, as the rate limits are: connections spread over them.
        limit = max(1, math.ceil(config.auth_failures_per_minute / config.effective_workers))
        lockout = FailureLockout(limit, LOCKOUT_WINDOW_S)
    return Authenticator(keys, lockout=lockout)
