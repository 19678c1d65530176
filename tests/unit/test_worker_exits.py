"""The arbiter's record of exited workers (servers/sync/exits.py) when gunicorn < 24 calls it from a signal handler."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from twinserve.servers.sync.exits import WorkerExits


class Recorder:
    """Records what `WorkerExits` calls, and how deep the calls were nested."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.depth = 0
        self.deepest = 0
        self.during_first: list[object] = []  # callables run inside the first record, as a signal handler would

    def record(self, kind: str, pid: int) -> None:
        self.depth += 1
        self.deepest = max(self.deepest, self.depth)
        try:
            if not self.calls:
                self.calls.append((kind, pid))
                for step in self.during_first:
                    step()  # type: ignore[operator]
            else:
                self.calls.append((kind, pid))
        finally:
            self.depth -= 1


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def exits(recorder: Recorder) -> WorkerExits:
    return WorkerExits(
        on_death=lambda pid: recorder.record("death", pid), on_stop=lambda pid: recorder.record("stop", pid)
    )


def test_each_exit_is_recorded_as_a_death_or_a_stop(exits: WorkerExits, recorder: Recorder) -> None:
    exits.exited(11, died=True)
    exits.exited(12, died=False)
    assert recorder.calls == [("death", 11), ("stop", 12)]


def test_an_exit_reported_during_a_record_waits_for_it(exits: WorkerExits, recorder: Recorder) -> None:
    recorder.during_first = [lambda: exits.exited(22, died=False), lambda: exits.exited(23, died=True)]
    exits.exited(21, died=True)
    assert recorder.calls == [("death", 21), ("stop", 22), ("death", 23)]
    assert recorder.deepest == 1  # never one record inside another


@pytest.fixture
def sigusr1() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGUSR1)
    yield
    signal.signal(signal.SIGUSR1, previous)


def test_a_real_signal_handler_reporting_an_exit_mid_record(
    exits: WorkerExits, recorder: Recorder, sigusr1: None
) -> None:
    """gunicorn 23's arbiter: SIGCHLD -> handle_chld -> reap_workers -> child_exit, while a first one still runs."""
    signal.signal(signal.SIGUSR1, lambda signum, frame: exits.exited(32, died=True))

    def interrupted() -> None:
        os.kill(os.getpid(), signal.SIGUSR1)  # Python runs the handler at the next bytecode, inside this record
        assert recorder.calls == [("stop", 31)], "the handler must not have recorded inside this record"

    recorder.during_first = [interrupted]
    exits.exited(31, died=False)
    assert recorder.calls == [("stop", 31), ("death", 32)]
    assert recorder.deepest == 1
