"""Priority lanes and deadline-aware admission in the batch queue's pure policy, and the admission controller's
reading of a request's priority (Triton's convention: 1 is the highest level)."""

from __future__ import annotations

from pathlib import Path

import pytest

from twinserve.config import load_config
from twinserve.core.admission import Admission, QueueBound
from twinserve.core.batch_queue import BatchQueue, Pending
from twinserve.errors import ClientError, ConfigError, DeadlineExceeded, DeadlineUnmeetable, QueueFull
from twinserve.observability.context import RequestContext


def pending(tag: str, priority: int = 1, n: int = 1, at: float = 0.0, deadline: float | None = None) -> Pending[str]:
    context = RequestContext(tag, "POST", "/")
    context.priority = priority
    return Pending([f"{tag}{i}" for i in range(n)], at, deadline, tag, context=context)


def tags(queue: BatchQueue[str], now: float) -> list[str]:
    batch = queue.take(now)
    assert batch is not None
    queue.done()
    return [r.waiter for r in batch.requests]


def test_batches_fill_from_the_highest_priority_first_fifo_within_a_level() -> None:
    q: BatchQueue[str] = BatchQueue(2, 0.0, 100, 1, levels=3)
    for tag, level in (("low-a", 3), ("mid", 2), ("low-b", 3), ("high-a", 1), ("high-b", 1)):
        q.put(pending(tag, level))
    assert tags(q, 0.0) == ["high-a", "high-b"]
    assert tags(q, 0.0) == ["mid", "low-a"]
    assert tags(q, 0.0) == ["low-b"]


def test_each_level_fills_only_its_share_so_the_lowest_is_refused_first() -> None:
    bound = QueueBound(6, levels=3)
    assert [bound.limit_for(p) for p in (1, 2, 3)] == [6, 4, 2]
    q: BatchQueue[str] = BatchQueue(8, 1.0, 6, 1, levels=3)
    q.put(pending("low-a", 3))
    q.put(pending("low-b", 3))
    with pytest.raises(QueueFull) as low:
        q.put(pending("low-c", 3))
    assert low.value.message == "the queue holds 2 instances (--max-queue 6, 2 of it for priority 3); retry shortly"
    for tag in ("mid-a", "mid-b"):
        q.put(pending(tag, 2))
    with pytest.raises(QueueFull):
        q.put(pending("mid-c", 2))
    q.put(pending("high-a", 1))
    q.put(pending("high-b", 1))  # the highest level may fill the whole queue
    with pytest.raises(QueueFull) as high:
        q.put(pending("high-c", 1))
    assert high.value.message == "the queue holds 6 instances (--max-queue 6); retry shortly"


def test_a_request_larger_than_its_share_goes_in_alone_never_refused_for_ever() -> None:
    bound = QueueBound(6, levels=3)
    bound.check(0, 5, "the queue holds 0 instances", 3)  # more than level 3's 2 places, but the queue is empty
    with pytest.raises(QueueFull):
        bound.check(1, 5, "the queue holds 1 instances", 3)
    with pytest.raises(QueueFull):
        bound.check(0, 7, "the queue holds 0 instances", 1)  # past the whole bound: never


def test_one_level_is_the_plain_queue_bound() -> None:
    q: BatchQueue[str] = BatchQueue(8, 1.0, 2, 1)
    q.put(pending("a", 3))  # a level past the configured ones counts as the lowest there is
    q.put(pending("b", 1))
    with pytest.raises(QueueFull):
        q.put(pending("c", 1))


def _measured(q: BatchQueue[str], seconds: float, batches: int = 3) -> None:
    for _ in range(batches):
        q.put(pending("warm"))
        q.take(0.0)
        q.done(seconds)


def test_a_deadline_the_queue_ahead_outlasts_is_refused_at_once() -> None:
    q: BatchQueue[str] = BatchQueue(1, 0.0, 100, 1)
    q.put(pending("early", deadline=0.01), now=0.0)  # no batch measured yet: nothing is refused on a guess
    assert tags(q, 0.0) == ["early"]
    _measured(q, 0.1)
    assert q.batch_seconds == pytest.approx(0.1)
    q.put(pending("first", deadline=0.25), now=0.0)  # one batch: ~0.1 s
    q.put(pending("second", deadline=0.25), now=0.0)  # two: ~0.2 s
    with pytest.raises(DeadlineUnmeetable) as refused:
        q.put(pending("third", deadline=0.25), now=0.0)  # three: ~0.3 s, past its deadline
    assert refused.value.status == 504 and refused.value.code == "deadline_unmeetable"
    assert isinstance(refused.value, DeadlineExceeded)
    q.put(pending("patient"), now=0.0)  # no deadline: admitted
    assert len(q) == 3


def test_the_estimate_counts_only_the_work_ahead_of_the_request() -> None:
    q: BatchQueue[str] = BatchQueue(1, 0.0, 100, 1, levels=2)
    _measured(q, 0.1)
    for i in range(5):
        q.put(pending(f"low{i}", 2), now=0.0)
    assert q.expected_wait(1, priority=2) == pytest.approx(0.6)
    assert q.expected_wait(1, priority=1) == pytest.approx(0.1)  # the low lane waits behind it
    q.put(pending("urgent", 1, deadline=0.15), now=0.0)
    q.take(0.0)  # the urgent request computes; every slot is now busy
    assert q.expected_wait(1, priority=1) == pytest.approx(0.2)  # the running batch finishes first


def test_past_the_count_bound_a_request_queues_while_the_wait_ahead_fits_the_wait_bound() -> None:
    q: BatchQueue[str] = BatchQueue(1, 0.0, 2, 1, max_wait=0.35)
    q.put(pending("a"))
    q.put(pending("b"))
    with pytest.raises(QueueFull):
        q.put(pending("c"))  # nothing measured yet: the count bound alone decides
    q.drain()
    _measured(q, 0.1)
    for tag in ("a", "b", "c"):  # waits of 0.1, 0.2 and 0.3 s: "c" is past the count but within 0.35 s
        q.put(pending(tag))
    with pytest.raises(QueueFull) as refused:
        q.put(pending("d"))  # 0.4 s
    assert refused.value.message == (
        "the queue holds 3 instances (--max-queue 2; the wait ahead, 400 ms, is past --max-queue-wait-ms); "
        "retry shortly"
    )


def test_each_level_may_wait_only_its_share_of_the_wait_bound() -> None:
    bound = QueueBound(3, levels=3, max_wait=0.9)
    assert [bound.wait_for(p) for p in (1, 2, 3)] == pytest.approx([0.9, 0.6, 0.3])
    bound.check(5, 1, "5 wait", 1, wait=0.8)
    bound.check(5, 1, "5 wait", 2, wait=0.5)
    with pytest.raises(QueueFull):
        bound.check(5, 1, "5 wait", 3, wait=0.5)  # the lowest level is refused first in time too
    with pytest.raises(QueueFull):
        QueueBound(3, levels=3).check(5, 1, "5 wait", 1, wait=0.0)  # no wait bound: the count decides


def test_the_sync_backlog_waits_by_the_measured_time_between_take_ups_while_requests_wait() -> None:
    admission = Admission(load_config(arch="sync", threads=2, max_queue=2, max_queue_wait_ms=500))
    with pytest.raises(QueueFull):
        admission.shed(5)  # nothing measured: 5 waiting is past the count
    clock = 100.0
    for _ in range(9):  # a take-up every 50 ms, others still waiting behind each: the pool drains 20 a second
        clock += 0.05
        admission.taken_up(clock, behind=3)
    assert admission.backlog_wait(5) == pytest.approx(0.25)
    admission.shed(5)  # 5 ahead at 50 ms each: a quarter second, within 0.5 s
    with pytest.raises(QueueFull):
        admission.shed(11)  # 0.55 s


def test_an_interval_that_began_with_nothing_waiting_is_not_a_drain() -> None:
    admission = Admission(load_config(arch="sync", threads=2, max_queue=2, max_queue_wait_ms=500))
    clock = 0.0
    for _ in range(9):
        clock += 0.05
        admission.taken_up(clock, behind=1)
    admission.taken_up(clock + 0.05, behind=0)  # the last one waiting: the pool may idle from here
    admission.taken_up(clock + 30.0, behind=2)  # 30 s later, a new crowd's first: the idle time is no drain
    admission.taken_up(clock + 30.05, behind=1)
    assert admission.drain_seconds == pytest.approx(0.05)


def test_before_any_drain_the_backlog_waits_by_the_apps_time_per_request_over_the_threads() -> None:
    admission = Admission(load_config(arch="sync", threads=2, max_queue=2, max_queue_wait_ms=500))
    for _ in range(8):
        admission.served(0.1)  # sequential requests: never a backlog, so no drain measured
    assert admission.backlog_wait(5) == pytest.approx(0.25)
    clock = 0.0
    for _ in range(9):  # then a crowd: the measured drain (parse, write and the GIL included) takes over
        clock += 0.08
        admission.taken_up(clock, behind=4)
    assert admission.backlog_wait(5) == pytest.approx(0.4)


def test_batch_time_is_a_moving_average() -> None:
    q: BatchQueue[str] = BatchQueue(1, 0.0, 100, 1)
    _measured(q, 0.1)
    _measured(q, 0.2, batches=1)
    assert q.batch_seconds == pytest.approx(0.12)


def test_priority_from_header_or_parameter_within_the_configured_levels() -> None:
    admission = Admission(load_config(priority_levels=3, default_priority=2))
    assert admission.priority(None) == 2
    assert admission.priority("1") == 1 and admission.priority(" 3 ") == 3 and admission.priority(3) == 3
    for bad in ("0", "4", "high", "1.5", True, 2.0):
        with pytest.raises(ClientError) as info:
            admission.priority(bad)  # type: ignore[arg-type]
        assert "from 1 (the highest) to 3" in info.value.message
    with pytest.raises(ClientError, match=r"parameters\.priority"):
        admission.priority(9, "parameters.priority")


def test_default_priority_must_be_a_configured_level() -> None:
    with pytest.raises(ConfigError, match="--default-priority 4 is past --priority-levels 3"):
        load_config(priority_levels=3, default_priority=4)


def test_an_api_keys_level_is_its_default_and_its_highest() -> None:
    admission = Admission(load_config(default_priority=1), key_priorities={"batchkey": 3, "vipkey": 1})
    assert admission.priority(None, key_id="batchkey") == 3  # its default
    assert admission.priority("1", key_id="batchkey") == 3  # it may not jump the queue
    assert admission.priority("2", key_id="vipkey") == 2  # it may ask for less
    assert admission.priority(None, key_id="other") == 1 and admission.priority(None) == 1


def test_key_file_lines_may_give_a_priority(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# batch jobs\nbatch-0123456789abcdef priority=3\n\nvip-0123456789abcdefg\n")
    config = load_config(api_key_file=str(keys))
    assert config.all_api_keys() == ["batch-0123456789abcdef", "vip-0123456789abcdefg"]
    assert config.api_key_priorities() == {"batch-0123456789abcdef": 3}
    for line, problem in (("k-0123456789abcdef priority=4", "outside 1..3"), ("k-0123456789abcdef weight=2", "only")):
        keys.write_text(line + "\n")
        with pytest.raises(ConfigError, match=problem) as info:
            load_config(api_key_file=str(keys))
        assert "k-0123456789abcdef" not in str(info.value)  # a key never reaches a message
