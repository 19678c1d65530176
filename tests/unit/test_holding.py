"""Requests held by the sync worker's poller (servers/sync/holding.py): `Holding`'s order, levels and deadlines; the
order in which the poller handles a pass's events (servers/sync/worker.py `pass_order`). The servers holding real
connections are tests/live/hardening/test_early_refusal.py's."""

from __future__ import annotations

import selectors
import socket
from dataclasses import dataclass
from typing import Any

from twinserve.servers.http1 import Limits
from twinserve.servers.sync.connection import Connection, pass_order
from twinserve.servers.sync.holding import Holding

LIMITS = Limits(max_request_line=8190, max_header_count=100, max_header_bytes=8190, max_body_bytes=1 << 20)


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


def test_a_poller_pass_takes_wake_ups_and_listeners_first_then_connections_by_level() -> None:
    """The sync worker's poller reads a pass's readable connections by the level of each one's last request, the
    highest first (a high priority beside a crowd is read before the crowd), after the threads' wake-up (a thread
    is free: a held request can go to it) and the listeners; within a level in epoll's order."""

    def connection(name: str, level: int) -> Connection:
        conn = Connection(socket.socket(), None, LIMITS)
        conn.level = level
        conn.sock.close()
        conns[id(conn)] = name
        return conn

    conns: dict[int, str] = {}
    lows = [connection(f"low-{i}", 3) for i in range(3)]
    high, mid = connection("high", 1), connection("mid", 2)
    events = [_event(lows[0]), _event(high), _event(None), _event(lows[1]), _event(mid), _event("listener")]
    events += [_event(lows[2])]
    events.sort(key=pass_order)
    names = [conns.get(id(key.data), key.data) for key, _ in events]
    assert names == [None, "listener", "high", "mid", "low-0", "low-1", "low-2"]


@dataclass(eq=False)
class _Queue:
    """A model's batch queue that takes `room` more instances, at the levels up to `admitted`."""

    room_: int = 0
    admitted: int = 0

    def admits(self, priority: int = 1) -> bool:
        return priority <= self.admitted

    def room(self) -> int:
        return self.room_
