"""The garbage collector's pauses, kept short while a process serves.

CPython's full collection walks every object the collector tracks, and a serving process holds a great many that
live as long as it does: its imports and its models (numpy, scikit-learn, pydantic, uvicorn...: 130,000 objects
for the built-in iris example). Under load, full collections came every 1-2 s and each stopped the event loop (or
every request thread: one GIL) for 50-120 ms; measured with the async server, a high-priority client beside 500
low-priority connections, these pauses were the whole of its P99 (108 ms where its median was 21 ms). SGLang met
the same stalls (sgl-project/sglang#9241).

`settle` runs once in each serving process (a server process, a model worker), after its models have loaded and
before it serves: one full collection, then everything still alive is frozen (`gc.freeze`), out of every later
collection's walk. What serving creates is collected as before, and the youngest generation is collected per
`YOUNG_THRESHOLD` allocations rather than CPython's 700: a request's objects are mostly still in flight at a
collection, so a small threshold moved them to the older generations, each pass walking them again; measured in
the same run, the collector's time fell from ~65 ms to ~10 ms a second. Ray Serve's replicas settle too. Not done
in a process that merely builds an app (the tests' in-process apps): freezing is for processes that serve from then
on.

Frozen objects are never collected: a model unloaded while the server runs would leave its reference cycles
behind. `collect_all` (after an unload) unfreezes, collects and freezes again.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "collect_all", "settle"]

#: Allocations (less deallocations) of tracked objects between two collections of the youngest generation.
YOUNG_THRESHOLD = 10_000


def settle() -> None:
    """Freeze what this process holds now, and collect the young generation less often (see the module)."""
    gc.collect()  # startup's own garbage is freed, not frozen
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)


def collect_all() -> None:
    """A full collection that reaches frozen objects too (a model's, once unloaded); frozen again after, if the
    process had settled."""
    frozen = gc.get_freeze_count() > 0
    gc.unfreeze()
    gc.collect()
    if frozen:
        gc.freeze()
