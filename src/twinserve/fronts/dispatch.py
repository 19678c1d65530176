"""The route table (`service/routes.py`) compiled once into the dispatcher the async front sends every request
through, HTTP and WebSocket alike.

A fixed path (`/v2/health/ready`) is one dict lookup, and its answer, every route in the table that matches it
included, is worked out when the table is compiled. A path with parameters is matched against the templates in
table order, except that the inference templates (`:predict`, `/infer`) are tried first: a template moves ahead
only of templates that can match none of its paths, so the first matching route is still the one the table
lists first. `{model}` and `{version}` each match one `MODEL_NAME_PATTERN` (no `/`, no `:`).

Matching is exact: no trailing-slash redirect (`/v2/` is 404). A route for GET also answers HEAD, as in both
frameworks. A path some route matches with another method is 405, with `Allow` naming that route's methods.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from twinserve.errors import MethodNotAllowed, NotFound
from twinserve.service.routes import MODEL_NAME_PATTERN, Route

__all__ = ["HOT_ROUTES", "ROUTE_ERRORS", "Dispatcher"]

T = TypeVar("T")
#: The routes tried first among the templates: the inference hot path.
HOT_ROUTES = frozenset({"predict", "infer"})
#: What `Dispatcher.match` raises.
ROUTE_ERRORS = (NotFound, MethodNotAllowed)

_SEPARATORS = "/:"
# A parameter is one whole word between separators, so that matching needs no backtracking.
assert f"[^{_SEPARATORS}]+" == MODEL_NAME_PATTERN, "dispatch.py matches a parameter as one word"
_PARAM = re.compile(r"\{(\w+)\}")
_WORDS = re.compile(f"([{_SEPARATORS}])")


def _methods(route: Route) -> frozenset[str]:
    return frozenset({route.method, "HEAD"} if route.method == "GET" else {route.method})


def _shown(path: str) -> str:
    """The path as an error message shows it: as the front's URL reads it (Starlette's `Request.url.path`)."""
    path = path.replace("?", "%3F").replace("#", "%23").replace("\\", "%5C")
    return path.replace("\t", "").replace("\r", "").replace("\n", "")


@dataclass(frozen=True, slots=True)
class _Entry(Generic[T]):
    route: Route
    target: T
    methods: frozenset[str]
    allow: str  # the `Allow` header of a 405 on this route's paths


class _Template(Generic[T]):
    """One route with parameters: a literal prefix, the parameters and the literals between them, a literal
    suffix. `/v2/models/{model}/versions/{version}/infer` is `/v2/models/`, model, `/versions/`, version,
    `/infer`."""

    __slots__ = ("entry", "literals", "names", "prefix", "single", "suffix", "words")

    def __init__(self, entry: _Entry[T]) -> None:
        self.entry = entry
        path = entry.route.path
        parts = _PARAM.split(path)  # literal, name, literal, name, ..., literal
        self.names: tuple[str, ...] = tuple(parts[1::2])
        literals = parts[0::2]
        for before, after in itertools.pairwise(literals):
            if not before or before[-1] not in _SEPARATORS or (after and after[0] not in _SEPARATORS):
                raise ValueError(f"{path}: a parameter must be a whole segment (between '/' or ':')")
        self.prefix, self.suffix = literals[0], literals[-1]
        self.literals: tuple[str, ...] = tuple(literals[1:-1])
        self.single = len(self.names) == 1
        #: The path split into separators and words; a parameter's word is None.
        self.words: tuple[str | None, ...] = tuple(None if _PARAM.fullmatch(w) else w for w in _WORDS.split(path))

    def match(self, path: str) -> dict[str, str] | None:
        prefix, suffix = self.prefix, self.suffix
        if not (path.startswith(prefix) and path.endswith(suffix)) or len(path) <= len(prefix) + len(suffix):
            return None
        middle = path[len(prefix) : len(path) - len(suffix)]
        if self.single:
            if "/" in middle or ":" in middle:
                return None
            return {self.names[0]: middle}
        params: dict[str, str] = {}
        for name, literal in zip(self.names, (*self.literals, ""), strict=True):
            end = _word_end(middle)
            if end == 0 or not middle.startswith(literal, end) or (not literal and end != len(middle)):
                return None
            params[name] = middle[:end]
            middle = middle[end + len(literal) :]
        return params

    def overlaps(self, other: _Template[T]) -> bool:
        """Whether some path matches both templates."""
        if len(self.words) != len(other.words):
            return False
        for mine, theirs in zip(self.words, other.words, strict=True):
            if mine is None and theirs is None:
                continue
            if mine is None or theirs is None:
                if (theirs if mine is None else mine) in ("", *_SEPARATORS):
                    return False
            elif mine != theirs:
                return False
        return True


def _word_end(text: str) -> int:
    """Where the first word of `text` ends: its first separator, or its end."""
    ends = [i for i in (text.find(s) for s in _SEPARATORS) if i >= 0]
    return min(ends) if ends else len(text)


class Dispatcher(Generic[T]):
    """The routes compiled once; `match(method, path)` is each request's route and path parameters."""

    def __init__(self, table: Iterable[tuple[Route, T]]) -> None:
        entries = [
            _Entry(route, target, methods, ", ".join(sorted(methods)))
            for route, target in table
            for methods in (_methods(route),)
        ]
        templates = [_Template(e) for e in entries if "{" in e.route.path]
        self._templates: tuple[_Template[T], ...] = tuple(_hot_first(templates))
        #: Each fixed path -> every entry that matches it (its own and templates'), in table order.
        self._static: dict[str, list[tuple[_Entry[T], dict[str, str]]]] = {}
        for entry in entries:
            path = entry.route.path
            if "{" in path or path in self._static:
                continue
            found: list[tuple[_Entry[T], dict[str, str]]] = []
            for other in entries:
                if other.route.path == path:
                    found.append((other, {}))
                elif "{" in other.route.path:
                    params = _Template(other).match(path)
                    if params is not None:
                        found.append((other, params))
            self._static[path] = found

    def match(self, method: str, path: str) -> tuple[T, dict[str, str]]:
        """The target of the route `method path` asks for, and the path's parameters. Raises NotFound (404)
        when no route has the path, MethodNotAllowed (405, with `Allow`) when none has it for `method`."""
        partial: _Entry[T] | None = None
        static = self._static.get(path)
        if static is not None:
            for entry, params in static:
                if method in entry.methods:
                    return entry.target, dict(params)
                partial = partial or entry
        else:
            for template in self._templates:
                found = template.match(path)
                if found is not None:
                    if method in template.entry.methods:
                        return template.entry.target, found
                    partial = partial or template.entry
        if partial is None:
            raise NotFound(f"no route for {method} {_shown(path)}")
        error = MethodNotAllowed(f"{method} is not allowed on {_shown(path)}")
        error.headers["Allow"] = partial.allow
        raise error


def _hot_first(templates: list[_Template[T]]) -> list[_Template[T]]:
    """`templates` with each hot route moved as far forward as it can go without passing one it overlaps."""
    ordered: list[_Template[T]] = []
    for template in templates:
        at = len(ordered)
        if template.entry.route.name in HOT_ROUTES:
            while at > 0 and ordered[at - 1].entry.route.name not in HOT_ROUTES:
                if ordered[at - 1].overlaps(template):
                    break
                at -= 1
        ordered.insert(at, template)
    return ordered
