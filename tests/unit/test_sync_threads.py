"""The sync front's request threads take the highest priority level waiting next (servers/sync/threads.py).

A `ThreadPoolExecutor` is first come, first served; `LevelledThreadPool` is the sync worker's pool instead. The pool
is driven here directly, one thread kept busy behind a gate so that the order in which the rest are taken up is the
pool's alone. The served path is in tests/live/hardening/test_early_refusal.py.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from twinserve.servers.sync.threads import QUICK, LevelledThreadPool

TIMEOUT_S = 30.0


def _pool() -> tuple[LevelledThreadPool, threading.Event, list[str]]:
    """A one-thread pool whose thread is held on a gate; `ran` lists what ran, in order."""
    pool = LevelledThreadPool(1, lambda conn: conn.level)
    gate, started = threading.Event(), threading.Event()
    ran: list[str] = []

    def busy(conn: SimpleNamespace) -> None:
        started.set()
        assert gate.wait(TIMEOUT_S)

    pool.submit(busy, SimpleNamespace(level=1))
    assert started.wait(TIMEOUT_S)
    return pool, gate, ran


def test_the_highest_level_waiting_is_taken_next_then_the_longest_waiting() -> None:
    pool, gate, ran = _pool()
    for name, level in (("low-1", 3), ("mid", 2), ("low-2", 3), ("high-1", 1), ("high-2", 1)):
        pool.submit(lambda conn: ran.append(conn.name), SimpleNamespace(name=name, level=level))
    gate.set()
    pool.shutdown(wait=True)
    assert ran == ["high-1", "high-2", "mid", "low-1", "low-2"]


def test_ahead_of_counts_what_a_thread_takes_before_a_request_at_a_level() -> None:
    pool, gate, _ = _pool()
    for level in (3, 3, 2, 1):
        pool.submit(lambda conn: None, SimpleNamespace(level=level))
    assert (pool.ahead_of(1), pool.ahead_of(2), pool.ahead_of(3), len(pool)) == (1, 2, 4, 4)
    gate.set()
    pool.shutdown(wait=True)
    assert (pool.ahead_of(3), len(pool)) == (0, 0)


def test_requests_answered_without_the_model_go_last_and_count_at_no_level() -> None:
    """An invalid `X-Priority` (the app's 400, no model time) is no backlog: a crowd sending one must not fill the
    queue bound that a valid level-1 request is weighed against; and it is taken after every valid level, so that
    such a crowd does not keep the threads from valid requests either."""
    pool, gate, ran = _pool()
    for name, level in (("low", 3), ("high", 1), ("invalid-1", QUICK), ("invalid-2", QUICK)):
        pool.submit(lambda conn: ran.append(conn.name), SimpleNamespace(name=name, level=level))
    assert (pool.ahead_of(1), pool.ahead_of(3), pool.counted(), len(pool)) == (1, 2, 2, 4)
    gate.set()
    pool.shutdown(wait=True)
    assert ran == ["high", "low", "invalid-1", "invalid-2"]


def test_futures_carry_results_and_exceptions_and_shutdown_lets_what_is_queued_finish() -> None:
    pool, gate, _ = _pool()

    def fails(conn: SimpleNamespace) -> None:
        raise ValueError(conn.level)

    answered = pool.submit(lambda conn, plus: conn.level + plus, SimpleNamespace(level=2), plus=40)
    failed = pool.submit(fails, SimpleNamespace(level=2))
    pool.shutdown(wait=False)  # as gthread does on its way out: queued requests are still answered
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(fails, SimpleNamespace(level=1))
    gate.set()
    assert answered.result(TIMEOUT_S) == 42
    with pytest.raises(ValueError, match="2"):
        failed.result(TIMEOUT_S)
    pool.shutdown(wait=True)


def test_a_cancelled_request_is_not_run() -> None:
    pool, gate, ran = _pool()
    cancelled = pool.submit(lambda conn: ran.append("cancelled"), SimpleNamespace(level=1))
    assert cancelled.cancel()
    pool.submit(lambda conn: ran.append("kept"), SimpleNamespace(level=1))
    gate.set()
    pool.shutdown(wait=True)
    assert ran == ["kept"]
