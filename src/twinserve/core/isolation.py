"""Failure isolation: when `predict` raises for a batch of several requests, find the failing ones by bisection.

A failed batch is re-run in halves (by request, whose instances stay together) until every request is answered
or has failed alone, within a budget (`--isolate-max-reruns`); requests left unresolved fail with the error of the
smallest batch they were in. Only errors the model's own code raised are bisected (`ModelFailed`, a `ClientError`
it raised): an `OutputMismatch` says nothing about which instance is at fault, a `WorkerDied` would kill a worker
per re-run, and anything else is not the model's doing. A model whose `predict` must not run twice on an instance
opts out with `isolate_failures = False`. `Bisection` is the pure policy; `bisect` and `abisect` drive it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from twinserve.errors import ClientDisconnected, ClientError, ModelFailed, OutputMismatch, TwinserveError

__all__ = ["Bisection", "Isolated", "Outcome", "abisect", "bisect", "isolatable", "split_outputs"]

#: What one request gets from a batch: its outputs, in order, or the error it failed with.
Outcome = list[Any] | TwinserveError


def isolatable(error: BaseException) -> bool:
    """Whether `error` is the model's own failure, worth bisecting the batch for."""
    return isinstance(error, ModelFailed) or (
        isinstance(error, ClientError) and not isinstance(error, ClientDisconnected)
    )


def split_outputs(sizes: Sequence[int], outputs: Any) -> list[list[Any]]:
    """The outputs of one predict call -> one list per request (of `sizes` instances each); counts must match."""
    total = sum(sizes)
    try:
        count = len(outputs)
    except TypeError:
        raise OutputMismatch(f"predict must return a list, got {type(outputs).__name__}") from None
    if count != total:
        raise OutputMismatch(f"predict returned {count} outputs for {total} inputs")
    parts, start = [], 0
    for size in sizes:
        parts.append(list(outputs[start : start + size]))
        start += size
    return parts


@dataclass(frozen=True)
class Isolated:
    """The result of isolating a failed batch: one outcome per request, and the predict calls it took."""

    outcomes: list[Outcome]
    reruns: int

    @property
    def failed(self) -> list[int]:
        """Indices of the requests that failed."""
        return [i for i, outcome in enumerate(self.outcomes) if isinstance(outcome, TwinserveError)]


class Bisection:
    """The bisection policy over the requests of one failed batch (indices into `sizes`, instances per request).

    Drive it with `next()` (the requests to run, or None when done) and report each run with `succeeded(parts)`
    or `failed(error)`; then `result()`. No I/O, no clock: unit-tested on its own.
    """

    def __init__(self, sizes: Sequence[int], error: TwinserveError, max_reruns: int) -> None:
        if max_reruns < 0:
            raise ValueError("max_reruns must be >= 0")
        self.sizes = list(sizes)
        self.max_reruns = max_reruns
        self.reruns = 0
        self._outcomes: list[Outcome | None] = [None] * len(self.sizes)
        # Groups still to run, each with the error of the batch it came from; a stack, so each half is
        # settled before the next is touched (left first).
        self._todo: list[tuple[list[int], TwinserveError]] = []
        self._running: list[int] | None = None
        self._settle(list(range(len(self.sizes))), error)

    def next(self, abandoned: Callable[[int], bool] | None = None) -> list[int] | None:
        """The requests to run together next, or None once every request has an outcome.

        Requests for which `abandoned` is true (their client left, their deadline passed: nobody waits for
        them any more) are settled with their group's error instead of being computed again.
        """
        if self._running is not None:
            raise RuntimeError("report the running group with succeeded() or failed() first")
        while self._todo:
            if self.reruns >= self.max_reruns:
                for group, error in self._todo:  # out of budget: fail what is left with what it last failed with
                    for request in group:
                        self._outcomes[request] = error
                self._todo.clear()
                break
            group, error = self._todo.pop()
            if abandoned is not None:
                for request in [r for r in group if abandoned(r)]:
                    self._outcomes[request] = error
                    group.remove(request)
            if group:
                self._running = group
                self.reruns += 1
                return list(group)
        return None

    def succeeded(self, parts: Sequence[list[Any]]) -> None:
        """The running group computed: `parts` holds each of its requests' outputs, in order."""
        group = self._take_running()
        if len(parts) != len(group):
            raise ValueError(f"{len(parts)} parts for a group of {len(group)} requests")
        for request, part in zip(group, parts, strict=True):
            self._outcomes[request] = part

    def failed(self, error: TwinserveError) -> None:
        """The running group failed with `error`."""
        self._settle(self._take_running(), error)

    def result(self) -> Isolated:
        if self._running is not None or self._todo or any(o is None for o in self._outcomes):
            raise RuntimeError("the bisection is not finished: call next() until it returns None")
        return Isolated([o for o in self._outcomes if o is not None], self.reruns)

    def _take_running(self) -> list[int]:
        if self._running is None:
            raise RuntimeError("no group is running: call next() first")
        group, self._running = self._running, None
        return group

    def _settle(self, group: list[int], error: TwinserveError) -> None:
        if len(group) > 1 and isolatable(error):
            middle = len(group) // 2
            self._todo.append((group[middle:], error))
            self._todo.append((group[:middle], error))
        else:
            for request in group:
                self._outcomes[request] = error


def bisect(
    run: Callable[[list[Any]], Any],
    groups: Sequence[list[Any]],
    error: TwinserveError,
    max_reruns: int,
    abandoned: Callable[[int], bool] | None = None,
) -> Isolated:
    """Isolate the failing requests (instance lists) of a batch that failed with `error`, re-running `run`.

    `abandoned(i)`, if given, tells whether request i is still awaited (see `Bisection.next`).
    """
    plan = Bisection([len(g) for g in groups], error, max_reruns)
    while (part := plan.next(abandoned)) is not None:
        try:
            outputs = run([instance for request in part for instance in groups[request]])
            parts = split_outputs([len(groups[request]) for request in part], outputs)
        except TwinserveError as exc:
            plan.failed(exc)
        else:
            plan.succeeded(parts)
    return plan.result()


async def abisect(
    run: Callable[[list[Any]], Awaitable[Any]],
    groups: Sequence[list[Any]],
    error: TwinserveError,
    max_reruns: int,
    abandoned: Callable[[int], bool] | None = None,
) -> Isolated:
    """`bisect` over a coroutine `run`."""
    plan = Bisection([len(g) for g in groups], error, max_reruns)
    while (part := plan.next(abandoned)) is not None:
        try:
            outputs = await run([instance for request in part for instance in groups[request]])
            parts = split_outputs([len(groups[request]) for request in part], outputs)
        except TwinserveError as exc:
            plan.failed(exc)
        else:
            plan.succeeded(parts)
    return plan.result()
