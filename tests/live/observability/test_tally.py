"""Counts written in sums at most once an interval (observability/tally.py), as the early refusals' metrics are."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from tests.serving import wait_until
from twinserve.observability.tally import Tally


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_first_count_is_written_at_once_and_the_rest_of_the_interval_in_one_sum() -> None:
    clock, written = Clock(), list[tuple[dict[str, float], float]]()
    tally: Tally[str] = Tally(lambda c, s: written.append((c, s)), interval_s=1000.0, clock=clock)  # no timer here
    tally.add("a")
    assert written == [({"a": 1}, 0.0)]  # after a quiet interval: at once
    for key in ("a", "b", "a"):
        clock.now += 1.0
        tally.add(key)
    assert len(written) == 1  # within the interval: held
    clock.now += 1.0
    tally.flush()  # as /metrics does before it renders
    assert written[1] == ({"a": 2, "b": 1}, 3.0)  # the seconds from the first held count to the write
    tally.flush()
    assert len(written) == 2  # nothing counted, nothing written


def test_counts_held_within_the_interval_are_written_when_it_ends_with_nothing_after_them() -> None:
    written: list[dict[str, float]] = []
    tally: Tally[str] = Tally(lambda c, _: written.append(c), interval_s=0.05)
    tally.add("x")
    tally.add("x")
    tally.add("y")
    wait_until(lambda: len(written) == 2, timeout=10.0)
    assert written == [{"x": 1}, {"x": 1, "y": 1}]


def test_no_count_is_lost_between_threads() -> None:
    totals: dict[int, float] = {}
    lock = threading.Lock()

    def write(counts: dict[int, float], _: float) -> None:
        with lock:
            for key, n in counts.items():
                totals[key] = totals.get(key, 0) + n

    tally: Tally[int] = Tally(write, interval_s=0.001)

    def adds(key: int) -> None:
        for _ in range(2000):
            tally.add(key)

    threads = [threading.Thread(target=adds, args=(k % 3,)) for k in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    tally.flush()
    assert totals == {0: 4000, 1: 4000, 2: 4000}


def test_what_is_held_when_the_process_exits_is_written(tmp_path: Path) -> None:
    out = tmp_path / "written"
    script = (
        "from twinserve.observability.tally import Tally\n"
        f"t = Tally(lambda c, _: open({str(out)!r}, 'a').write(repr(sorted(c.items())) + '\\n'), interval_s=1000.0)\n"
        "t.add('a'); t.add('a'); t.add('b')\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert out.read_text().splitlines() == ["[('a', 1)]", "[('a', 1), ('b', 1)]"]


def test_amounts_added_at_one_time_are_summed_per_key() -> None:
    written: list[dict[str, float]] = []
    clock = Clock()
    tally: Tally[str] = Tally(lambda c, _: written.append(c), interval_s=1000.0, clock=clock)
    tally.add("first")
    tally.add_all([("bucket", 1), ("sum", 0.25)])
    tally.add_all([("bucket", 1), ("sum", 0.5), ("gauge", -1)])
    tally.flush()
    assert written == [{"first": 1}, {"bucket": 2, "sum": 0.75, "gauge": -1}]


def test_a_forked_child_does_not_write_its_parents_held_counts() -> None:
    """A model worker forked from a serving process would count the parent's held requests a second time."""
    written: list[dict[str, float]] = []
    tally: Tally[str] = Tally(lambda c, _: written.append(c), interval_s=1000.0)
    tally.add("a")
    tally.add("held")  # within the interval: held when the process forks
    pid = os.fork()
    if pid == 0:  # the child: its flush must write nothing of the parent's
        before = len(written)
        tally.flush()
        tally.add("own")
        tally.flush()
        os._exit(0 if written[before:] == [{"own": 1}] else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    tally.flush()
    assert written == [{"a": 1}, {"held": 1}]  # the parent still writes its own
