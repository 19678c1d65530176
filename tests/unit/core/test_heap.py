"""core/heap.py: a serving process freezes what it holds once its models have loaded, and an unload still frees a
frozen model's reference cycles. Each case runs in a fresh interpreter: freezing is for the whole process, and the
test runner's own heap must stay as it is."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from twinserve.core.heap import YOUNG_THRESHOLD


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_settle_frees_startup_garbage_then_freezes_what_is_alive() -> None:
    out = _run(
        """
        import gc, weakref
        from twinserve.core.heap import settle

        class Node: ...

        gc.disable()  # no collection but settle's own
        kept, garbage = Node(), Node()
        garbage.me = garbage  # a reference cycle no longer reachable: startup's garbage
        gone = weakref.ref(garbage)
        del garbage
        settle()
        print(gone() is None, not any(obj is kept for obj in gc.get_objects()), gc.get_threshold()[0])
        """
    )
    assert out == f"True True {YOUNG_THRESHOLD}"


def test_collect_all_frees_a_frozen_cycle_and_freezes_the_rest_again() -> None:
    out = _run(
        """
        import gc, weakref
        from twinserve.core.heap import collect_all, settle

        class Model: ...

        model = Model()
        model.me = model  # a model's own reference cycle, frozen with the process once it has loaded
        settle()
        gone = weakref.ref(model)
        del model  # unloaded
        gc.collect()
        survived = gone() is not None  # a plain collection does not reach frozen objects
        collect_all()
        print(survived, gone() is None, gc.get_freeze_count() > 0)
        """
    )
    assert out == "True True True"


def test_collect_all_leaves_a_process_that_never_settled_unfrozen() -> None:
    out = _run(
        """
        import gc
        from twinserve.core.heap import collect_all

        collect_all()
        print(gc.get_freeze_count())
        """
    )
    assert out == "0"
