"""Connections held unread (servers/holding.py): `Holding`'s order, levels and deadlines, and `ReadHolds` letting
an event loop's paused connections go as their model's queue takes requests again; the order in which the sync
poller handles a crowded pass's events (servers/gunicorn_poller.py `in_turn`). The servers holding real
connections are tests/live/hardening/test_early_refusal.py's."""

from __future__ import annotations

import asyncio
import selectors
from dataclasses import dataclass, field
from functools import partial
from types import SimpleNamespace
from typing import Any

from twinserve.servers.gunicorn_poller import PER_PASS, in_turn
from twinserve.servers.holding import TICK_S, Holding, ReadHolds


def test_held_connections_leave_the_highest_level_first_then_the_longest_held() -> None:
    held = Holding(levels=3)
    for conn, level in (("low-1", 3), ("mid", 2), ("low-2", 3), ("high", 1)):
        held.add(conn, level, deadline=100.0)
    assert len(held) == 4 and held.next_deadline() == 100.0
    assert [held.release(lambda level: True) for _ in range(4)] == ["high", "mid", "low-1", "low-2"]
    assert held.release(lambda level: True) is None and len(held) == 0


def test_a_level_the_backlog_refuses_keeps_every_lower_level_held() -> None:
    held = Holding(levels=2)
    held.add("high", 1, deadline=10.0)
    held.add("low", 2, deadline=10.0)
    held.add("low-later", 2, deadline=12.0)
    asked: list[int] = []

    def only_the_highest(level: int) -> bool:
        asked.append(level)
        return level == 1

    assert held.release(only_the_highest) == "high"
    assert held.release(only_the_highest) is None  # level 2 is refused: it stays held
    assert asked == [1, 2] and len(held) == 2


def test_held_past_the_deadline_are_taken_out_in_order() -> None:
    held = Holding(levels=2)
    held.add("a", 2, deadline=1.0)
    held.add("b", 2, deadline=2.0)
    held.add("c", 1, deadline=1.5)
    assert held.next_deadline() == 1.0
    assert held.expired(now=1.6) == [("c", 1), ("a", 2)]  # the highest level first, each level in the order held
    assert len(held) == 1 and held.next_deadline() == 2.0
    assert held.drain() == ["b"] and len(held) == 0 and held.next_deadline() is None


def test_one_let_in_at_its_wait_is_next_at_its_level_and_behind_every_higher_level() -> None:
    held = Holding(levels=3)
    held.add("low", 3, deadline=10.0)
    held.add("high", 1, deadline=10.0)
    assert held.ahead_of(3) == 1  # the high one goes first
    held.admit("low-let-in", 3, deadline=50.0)
    assert held.ahead_of(3) == 2 and held.ahead_of(1) == 0 and len(held) == 3
    assert held.expired(now=20.0) == [("high", 1), ("low", 3)]  # one let in is not weighed again
    held.add("high-2", 1, deadline=30.0)
    held.add("low-2", 3, deadline=30.0)
    assert [held.release(lambda level: True) for _ in range(3)] == ["high-2", "low-let-in", "low-2"]
    held.admit("gone", 2, deadline=50.0)
    assert held.remove("gone") and not held.remove("gone") and len(held) == 0


def test_held_past_their_wait_are_taken_out_no_more_than_asked_at_once() -> None:
    held = Holding(levels=2)
    for conn, level in (("a", 2), ("b", 2), ("c", 1)):
        held.add(conn, level, deadline=1.0)
    held.admit("let-in", 2, deadline=9.0)
    held.admit("let-in-later", 2, deadline=12.0)
    assert held.expired(now=5.0, limit=2) == [("c", 1), ("a", 2)]
    assert held.next_deadline() == 1.0  # past already: the poller looks again at once
    assert held.expired(now=5.0, limit=2) == [("b", 2)] and held.next_deadline() == 9.0
    # one let in whose turn the higher levels kept from it past its deadline goes anyway
    assert held.overdue(now=5.0, limit=2) == [] and held.overdue(now=12.0, limit=1) == ["let-in"]
    assert held.drain() == ["let-in-later"] and len(held) == 0


def _event(data: Any) -> tuple[selectors.SelectorKey, int]:
    return selectors.SelectorKey(fileobj=0, fd=0, events=selectors.EVENT_READ, data=data), selectors.EVENT_READ


def test_a_crowded_poller_pass_takes_finished_requests_first_then_a_bounded_number_of_connections_by_level() -> None:
    def readable(conn: Any, fileobj: Any) -> None: ...

    def method_queue(fileobj: Any) -> None: ...

    def names(conns: list[SimpleNamespace]) -> list[str]:
        events = [_event(partial(readable, conn)) for conn in conns] + [_event(method_queue)]
        turn, later = in_turn(events, default=2, turn=1)
        assert sorted(map(id, turn + later)) == sorted(map(id, events))  # each event now or later, none lost
        return [key.data.args[0].name if isinstance(key.data, partial) else "finished" for key, _ in turn]

    lows = [SimpleNamespace(name=f"low-{i}", level=3) for i in range(PER_PASS + 5)]
    high, unseen = SimpleNamespace(name="high", level=1), SimpleNamespace(name="new")  # no request seen yet
    # the threads' finished requests, then by level (each level in its order), PER_PASS connections in all
    first_lows = [c.name for c in lows][: PER_PASS - 2]
    assert names([*lows[:3], high, unseen, *lows[3:]]) == ["finished", "high", "new", *first_lows]
    highs = [SimpleNamespace(name=f"high-{i}", level=1) for i in range(PER_PASS + 5)]
    assert names([*lows, *highs]) == ["finished", *[c.name for c in highs][:PER_PASS]]  # a crowd at one level too


def test_connections_left_for_a_later_pass_go_first_in_it() -> None:
    """Within a level, the longest since its last turn first: not epoll's order, where a closed-loop client
    answered in one pass is ready again at the head of the next, and the same connections would take every turn."""

    def readable(conn: Any, fileobj: Any) -> None: ...

    crowd = [SimpleNamespace(name=f"c-{i}", level=1) for i in range(PER_PASS + 5)]
    events = [_event(partial(readable, conn)) for conn in crowd]
    _, later = in_turn(events, default=1, turn=1)
    assert [key.data.args[0] for key, _ in later] == crowd[PER_PASS:]
    second, _ = in_turn(events, default=1, turn=2)  # every one ready again, in epoll's order
    assert [key.data.args[0] for key, _ in second][:5] == crowd[PER_PASS:]
    assert all(conn.turn in (1, 2) for conn in crowd)


@dataclass(eq=False)
class _Queue:
    """A model's batch queue that takes `room` more instances, at the levels up to `admitted`."""

    room_: int = 0
    admitted: int = 0

    def admits(self, priority: int = 1) -> bool:
        return priority <= self.admitted

    def room(self) -> int:
        return self.room_


@dataclass(eq=False)
class _Conn:
    name: str
    released: list[str] = field(default_factory=list)

    def release_hold(self) -> None:
        self.released.append(self.name)


async def _ticks(n: int = 3) -> None:
    await asyncio.sleep(TICK_S * n + 0.01)


def test_read_holds_let_go_the_highest_level_first_no_more_than_the_queue_takes() -> None:
    async def scenario() -> None:
        holds = ReadHolds(asyncio.get_running_loop(), levels=2)
        queue, released = _Queue(), list[str]()
        conns = {name: _Conn(name, released) for name in ("low-1", "low-2", "high")}
        for name, level in (("low-1", 2), ("low-2", 2), ("high", 1)):
            holds.hold(conns[name], queue, level, wait_s=60.0)
        await _ticks()
        assert released == [] and len(holds) == 3  # the queue is full: every one stays paused
        queue.room_, queue.admitted = 2, 1
        await _ticks()
        assert released == ["high"]  # room for 2, but level 2 is still refused
        queue.admitted = 2
        await _ticks()
        assert released == ["high", "low-1", "low-2"] and len(holds) == 0

    asyncio.run(scenario())


def test_read_holds_let_go_at_the_deadline_and_forget_a_closed_connection() -> None:
    async def scenario() -> None:
        holds = ReadHolds(asyncio.get_running_loop(), levels=1)
        queue, released = _Queue(), list[str]()
        soon, later, closed = _Conn("soon", released), _Conn("later", released), _Conn("closed", released)
        holds.hold(soon, queue, 1, wait_s=0.0)
        holds.hold(later, queue, 1, wait_s=60.0)
        holds.hold(closed, queue, 1, wait_s=0.0)
        assert holds.forget(closed) and not holds.forget(closed)
        await _ticks()
        assert released == ["soon"] and len(holds) == 1  # at its wait, though the queue is still full

    asyncio.run(scenario())
