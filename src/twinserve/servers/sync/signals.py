"""A signal the arbiter sends a worker it has just forked is held until the worker can take it, never lost.

A forked process starts with its parent's signal handlers. Until a gunicorn worker installs its own (gunicorn's
`Worker.init_signals`, early in `init_process`), a SIGTERM sent to it runs the arbiter's handler instead, which
queues the signal for the arbiter's loop, in the worker's copy of the arbiter, where nothing ever reads it: the
worker goes on to serve, and the arbiter, stopping, waits out `--graceful-timeout` (30 s) before it kills it. That
happened to a server whose model failed to load: the first worker to fail stops the arbiter, which sends SIGTERM to
a second worker forked a moment before (1 start in 15 under load here, 31 s instead of 2 to exit; once in the
bench's "a server that cannot start" test, 35 s).

So the arbiter blocks the signals a worker handles around each fork (`hold_across_forks`, through Python's at-fork
hooks: gunicorn's own `pre_fork` hook has no counterpart in the parent after the fork), the parent unblocks them at
once, and the worker unblocks them once its handlers are in place (`release`): a signal sent in between is pending,
and delivered to the worker's own handler then.
"""

from __future__ import annotations

import os
import signal

__all__ = ["HELD", "hold_across_forks", "release"]

#: The signals a gunicorn worker handles (`Worker.init_signals`), and SIGHUP, which it leaves at the default.
HELD = frozenset(
    {signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1, signal.SIGWINCH, signal.SIGABRT, signal.SIGHUP}
)


def hold_across_forks() -> None:
    """In the arbiter, once: each fork of this process blocks `HELD` in the child until it calls `release`.

    Only the forks of this very process: the hooks are inherited by its children (a worker whose model forks), and
    there the child of a fork would keep the signals blocked for good."""
    arbiter = os.getpid()
    mask: set[int | signal.Signals] = set()

    def before() -> None:
        if os.getpid() == arbiter:
            mask.clear()
            mask.update(signal.pthread_sigmask(signal.SIG_BLOCK, HELD))

    def after_in_parent() -> None:
        if os.getpid() == arbiter:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    os.register_at_fork(before=before, after_in_parent=after_in_parent)


def release() -> None:
    """In a worker whose handlers are in place: the signals held since its fork are delivered to them now."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)
