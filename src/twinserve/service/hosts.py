"""Cross-site protection: which `Host` a request may name, which `Origin` may open a WebSocket, and which may
send what a page can send without a CORS preflight.

**Allowed hosts** defend against DNS rebinding: a page on `evil.example` whose name is made to resolve to
127.0.0.1 reaches a server on loopback as "same origin", but its requests still say `Host: evil.example`. Like
Django's ALLOWED_HOSTS and Starlette's TrustedHostMiddleware, the host is compared without its port and without
case, and an IPv6 literal keeps its brackets off (`[::1]:8000` is `::1`; Starlette's `split(":")` would cut it).
A pattern is a name or address, `.example.com` or `*.example.com` (the domain's subdomains, as Django's leading
dot), or `*` (any). The default follows the bind address: on loopback `localhost`, `127.0.0.1` and `::1`; on
a specific address that address; on `0.0.0.0` or `::` any host, since a server reachable under every name its
network gives it cannot know them (Kubernetes probes say `Host: <pod-ip>:<port>`).

A request without a `Host` is let through: browsers always send one, so its absence is no rebinding attack, and
a non-browser client could name any host anyway.

**WebSocket origins** defend against cross-site WebSocket hijacking: browsers let any page open a WebSocket to
any server and send no CORS preflight, only an `Origin` header. A handshake's Origin is allowed when it is the
same origin as the request (its host and port are the request's `Host`, as Django's CSRF check compares), when
`--cors-origins` allows it, or when its host matches a named allowed host (not `*`). A handshake without an
Origin comes from a program, not a page, and is allowed.

**Cross-site requests** (`check_site`): a page may send a POST to any server without a preflight when its body is
a form, text, or nothing (`<form>`, `fetch(..., {mode: "no-cors"})`); it cannot read the answer, but the request
acts. So a request to a route that changes the server's state (loading, unloading, a traffic split), or a predict
whose body is form-typed or untyped (read as JSON for `curl -d`), is refused (403 `cross_site`) when its `Origin`
is not one a WebSocket could come from (above), or, without an `Origin`, when `Sec-Fetch-Site: cross-site` says a
browser sent it from another site (Django checks `Origin` on every unsafe method the same way). Those routes take
`application/json` bodies only (415 otherwise): a JSON body from a page needs a preflight, which `--cors-origins`
answers. Programs send no `Origin` and are not affected.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from twinserve.config import Config
from twinserve.errors import CrossSite, HostNotAllowed, UnsupportedMediaType
from twinserve.observability.tracing import Headers
from twinserve.service.routes import INFERENCE_ENDPOINTS, JSON, JSON_MEDIA_TYPE, STATE_CHANGING_ENDPOINTS

__all__ = ["HostPolicy", "check_site", "host_of", "host_policy"]

#: The media types a page may POST with no preflight (the Fetch standard's CORS-safelisted ones), or none at all.
_SIMPLE_TYPES = frozenset({"", "application/x-www-form-urlencoded", "multipart/form-data", "text/plain"})
#: The inference endpoints a page could POST a form to (a WebSocket's handshake has its own Origin rule, above).
_POSTED_INFERENCE = INFERENCE_ENDPOINTS - {"websocket"}

_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def host_of(value: str) -> str:
    """The host of a `Host` header value (or of an origin's netloc): no port, no IPv6 brackets, lower case,
    no trailing dot. "" when it cannot be a host."""
    value = value.strip().lower()
    if value.startswith("["):
        host, bracket, rest = value[1:].partition("]")
        return host if bracket and (not rest or rest.startswith(":")) else ""
    if ":" in value:
        host, _, port = value.partition(":")
        if ":" in port:
            return ""  # a bare IPv6 address is not a valid Host (RFC 9110 wants brackets)
        value = host
    return value.removesuffix(".")


def _pattern_host(pattern: str) -> str:
    """A host as an operator writes it (`--allowed-hosts`, `--host`): an IPv6 address with or without brackets."""
    pattern = pattern.strip().lower()
    return pattern.strip("[]") if pattern.count(":") > 1 else host_of(pattern)


def _bound_hosts(bind: str) -> tuple[str, ...]:
    """The hosts a server bound to `bind` answers to by default ("*": any)."""
    host = _pattern_host(bind)
    if host in ("", "0.0.0.0", "::"):
        return ("*",)
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    return tuple(dict.fromkeys((host, *_LOOPBACK_NAMES))) if loopback else (host,)


class HostPolicy:
    """The hosts a request may name, and the origins that may open a WebSocket."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self.any_host = "*" in patterns
        exact: set[str] = set()
        suffixes: list[str] = []
        for pattern in patterns:
            if pattern == "*":
                continue
            if pattern.startswith(("*.", ".")):
                suffixes.append("." + _pattern_host(pattern.lstrip("*.")))
            else:
                exact.add(_pattern_host(pattern))
        self.exact = frozenset(exact)
        self.suffixes = tuple(suffixes)

    def _named(self, host: str) -> bool:
        """Whether `host` matches a named pattern (the wildcard `*` aside)."""
        return host in self.exact or any(host.endswith(s) or host == s[1:] for s in self.suffixes)

    def allows_host(self, header: str | None) -> bool:
        """Whether a request whose `Host` header is `header` may be served."""
        if self.any_host or header is None:
            return True
        host = host_of(header)
        return bool(host) and self._named(host)

    def check_host(self, header: str | None) -> None:
        """Raise HostNotAllowed (400) unless `allows_host(header)`."""
        if not self.allows_host(header):
            raise self.refusal(header)

    @staticmethod
    def refusal(header: str | None) -> HostNotAllowed:
        """The 400 for a request whose `Host` is `header`."""
        # The host is named (cut short), the allowed ones are not: they may be internal names.
        return HostNotAllowed(f"host {host_of(header or '')[:100]!r} is not served here (--allowed-hosts)")

    def allows_origin(self, origin: str, host_header: str | None) -> bool:
        """Whether a page from `origin` may open a WebSocket on a request that says `Host: host_header`
        (`--cors-origins` is checked by the caller)."""
        parts = urlsplit(origin.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return False  # `null` (sandboxed frames, files) and anything else that is not a web origin
        if host_header is not None and parts.netloc.lower() == host_header.strip().lower():
            return True  # the same origin: the page was served by this server under this name
        host = host_of(parts.netloc)
        return bool(host) and self._named(host)


def host_policy(config: Config) -> HostPolicy:
    """The configured policy: `--allowed-hosts`, or the hosts the bind address implies."""
    return HostPolicy(config.allowed_hosts or _bound_hosts(config.host))


def check_site(endpoint: str, headers: Headers, origin_allowed: Callable[[str], bool]) -> None:
    """Refuse what a page on another site could make a browser send without a preflight (above): CrossSite (403)
    for a state-changing request or a predict with a simple media type whose `Origin` is not allowed (or, with no
    Origin, whose `Sec-Fetch-Site` is cross-site); UnsupportedMediaType (415) for a state-changing request whose body
    is not JSON. `origin_allowed(origin)` is the WebSocket rule."""
    changes = endpoint in STATE_CHANGING_ENDPOINTS
    media_type = (headers.get("content-type") or "").split(";", 1)[0].strip().lower()
    if not changes and not (endpoint in _POSTED_INFERENCE and media_type in _SIMPLE_TYPES):
        return
    origin = headers.get("origin")
    if origin is not None:
        refused = not origin_allowed(origin)
    else:
        refused = (headers.get("sec-fetch-site") or "").strip().lower() == "cross-site"
    if refused:
        what = "a change to the served models" if changes else f"a {media_type or 'typeless'} body"
        raise CrossSite(
            f"{what} from a page on another site ({(origin or 'Sec-Fetch-Site: cross-site')[:100]!r}) is refused: "
            f"send {JSON}, and allow the origin with --cors-origins"
        )
    if changes and media_type and not JSON_MEDIA_TYPE.match(media_type):
        raise UnsupportedMediaType(f"Content-Type must be {JSON}, got {media_type!r}")
