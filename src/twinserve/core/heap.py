"""The garbage collector's pauses, kept short while a process serves.

A full collection walks every tracked object, and a serving process holds many that live as long as it does (its
imports and models), so under load full collections stopped the event loop (or, through the GIL, every request
thread) long enough to dominate tail latency. `settle` runs once per serving process after its models load: one
full collection, then `gc.freeze` keeps what is alive out of every later walk, and the youngest generation is
collected less often (`YOUNG_THRESHOLD`), since a request's objects are mostly still in flight at a collection.
Frozen objects are never collected, so `collect_all` (after an unload) unfreezes, collects and freezes again.
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
