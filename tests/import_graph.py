"""The walk over an import graph that the layout tests share (tests/unit/test_layout.py between modules,
tests/unit/test_architecture.py between packages)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["find_cycle"]


def find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """The first cycle of `graph` (each node -> the nodes it imports) as the path that closes it, `a -> b -> a`, in
    a stable order (nodes and edges sorted); None when it has none. A node that only appears as a target has no
    edges of its own."""
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target, [*path, target])) is not None:
                return cycle
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node, [node])) is not None:
            return cycle
    return None
