"""Cross-origin resource sharing: one policy both fronts apply, so browsers see the same headers from each.

Starlette's CORSMiddleware and flask-cors differ in what they answer (status of a preflight, Vary, which headers
they echo, how they refuse), so neither is used: this small policy decides, and the fronts only copy its headers
onto their responses. A preflight is answered before authentication (browsers never send credentials on one).
"""

from __future__ import annotations

from collections.abc import Sequence

from twinserve.config import Config
from twinserve.core.admission import PRIORITY_HEADER, TIMEOUT_HEADER
from twinserve.errors import CorsRejected
from twinserve.protocol.v2 import HEADER_LENGTH
from twinserve.service.routes import REQUEST_ID_HEADER

__all__ = ["ALLOWED_HEADERS", "ALLOWED_METHODS", "CorsPolicy", "cors_policy", "merge_vary"]

ALLOWED_METHODS = ("GET", "POST")
#: Every request header twinserve reads, plus trace context. Simple headers (Accept, ...) need no permission.
ALLOWED_HEADERS = (
    "Authorization",
    "Content-Type",
    "X-API-Key",
    REQUEST_ID_HEADER,
    TIMEOUT_HEADER,
    PRIORITY_HEADER,
    HEADER_LENGTH,
    "traceparent",
    "tracestate",
)
#: Response headers a browser script may read besides the safelisted ones.
EXPOSED_HEADERS = (REQUEST_ID_HEADER, "Retry-After", HEADER_LENGTH, "WWW-Authenticate")


class CorsPolicy:
    """Which origins may call the server from a browser, and the headers that say so."""

    def __init__(self, origins: Sequence[str], allow_credentials: bool = False, max_age: int = 600) -> None:
        self.any_origin = "*" in origins
        if self.any_origin and allow_credentials:
            raise ValueError("CORS: '*' cannot be combined with credentials")
        self.origins = frozenset(o.rstrip("/") for o in origins if o != "*")
        self.allow_credentials = allow_credentials
        self._allowed_headers = frozenset(h.lower() for h in ALLOWED_HEADERS)
        self._vary: dict[str, str] = {} if self.any_origin else {"Vary": "Origin"}
        common = dict(self._vary)
        if allow_credentials:
            common["Access-Control-Allow-Credentials"] = "true"
        self._common = common
        self._preflight = {
            **common,
            "Access-Control-Allow-Methods": ", ".join(ALLOWED_METHODS),
            "Access-Control-Allow-Headers": ", ".join(ALLOWED_HEADERS),
            "Access-Control-Max-Age": str(max_age),
        }
        self._exposed = {**common, "Access-Control-Expose-Headers": ", ".join(EXPOSED_HEADERS)}

    def allows(self, origin: str) -> bool:
        return self.any_origin or origin in self.origins

    def _allow_origin(self, origin: str) -> str:
        return "*" if self.any_origin else origin

    def preflight(self, origin: str, requested_method: str, requested_headers: str | None) -> dict[str, str]:
        """The headers of the 204 answering a preflight. Raises CorsRejected (403) for what is not allowed."""
        if not self.allows(origin):
            raise CorsRejected(f"origin {origin!r} is not allowed (--cors-origins)", headers=dict(self._vary))
        if requested_method.upper() not in ALLOWED_METHODS:
            raise CorsRejected(
                f"method {requested_method!r} is not allowed cross-origin; allowed: {', '.join(ALLOWED_METHODS)}",
                headers=dict(self._vary),
            )
        for name in (requested_headers or "").split(","):
            name = name.strip().lower()
            if name and name not in self._allowed_headers:
                raise CorsRejected(
                    f"request header {name!r} is not allowed cross-origin; allowed: {', '.join(ALLOWED_HEADERS)}",
                    headers=dict(self._vary),
                )
        return {"Access-Control-Allow-Origin": self._allow_origin(origin), **self._preflight}

    def response_headers(self, origin: str | None) -> dict[str, str]:
        """Headers to add to an ordinary response: the grant when `origin` is allowed, else only `Vary`."""
        if origin is None or not self.allows(origin):
            return self._vary
        return {"Access-Control-Allow-Origin": self._allow_origin(origin), **self._exposed}


def merge_vary(known: str | None, added: str) -> str:
    """One `Vary` naming both what a reply varies on already (`known`: a gzip-able reply's Accept-Encoding) and
    what CORS adds (`added`): two `Vary` fields would be one too many for some caches. Every front merges here."""
    return f"{known}, {added}" if known else added


def cors_policy(config: Config) -> CorsPolicy | None:
    """The configured policy, or None when no origin is allowed (then no CORS header is ever sent)."""
    if not config.cors_origins:
        return None
    return CorsPolicy(config.cors_origins, config.cors_allow_credentials, config.cors_max_age)
