"""The batching policy on its own (no threads, no sockets), then each driver over a fake executor."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from twinserve.core.batch_queue import SWEEP_S
from twinserve.core.batcher import ANSWER_CHUNK, AsyncBatcher, BatchQueue, Pending, ThreadBatcher
from twinserve.errors import ClientDisconnected, DeadlineExceeded, ModelFailed, OutputMismatch, QueueFull

pytestmark = pytest.mark.timeout(60)


def pending(n: int, at: float = 0.0, deadline: float | None = None, tag: str = "r") -> Pending[str]:
    return Pending([f"{tag}{i}" for i in range(n)], at, deadline, tag)


def queue(size: int = 4, delay: float = 0.010, max_queue: int = 100, in_flight: int = 1) -> BatchQueue[str]:
    return BatchQueue(size, delay, max_queue, in_flight)


# -- the pure policy -------------------------------------------------------------------------------------------
def test_waits_for_delay_then_flushes_partial_batch() -> None:
    q = queue()
    q.put(pending(1, at=0.0))
    q.put(pending(1, at=0.004))
    assert q.take(now=0.009) is None
    assert q.next_flush_at() == pytest.approx(0.010)
    batch = q.take(now=0.010)
    assert batch is not None and batch.size == 2
    assert q.in_flight == 1 and len(q) == 0


def test_full_batch_flushes_without_waiting() -> None:
    q = queue(size=3)
    for i in range(4):
        q.put(pending(1, at=0.0, tag=f"t{i}"))
    batch = q.take(now=0.0)
    assert batch is not None
    assert [r.waiter for r in batch.requests] == ["t0", "t1", "t2"]
    assert q.queued_instances == 1


def test_requests_are_never_split_and_big_ones_go_alone() -> None:
    q = queue(size=4, delay=0)
    q.put(pending(3, tag="a"))
    q.put(pending(2, tag="b"))
    q.put(pending(6, tag="c"))
    sizes = []
    while (batch := q.take(now=1.0)) is not None:
        sizes.append([r.waiter for r in batch.requests])
        q.done()
    assert sizes == [["a"], ["b"], ["c"]]


def test_order_is_preserved_within_a_batch() -> None:
    q = queue(size=8, delay=0)
    q.put(pending(2, tag="x"))
    q.put(pending(3, tag="y"))
    batch = q.take(now=0.0)
    assert batch is not None
    assert batch.instances() == ["x0", "x1", "y0", "y1", "y2"]


def test_in_flight_bound_holds_batches_back() -> None:
    q = queue(size=2, delay=0, in_flight=1)
    q.put(pending(2, tag="a"))
    q.put(pending(2, tag="b"))
    assert q.take(now=0.0) is not None
    assert q.take(now=5.0) is None  # one batch computing: the next waits even though it is full
    assert q.wake_at() is None
    q.done()
    batch = q.take(now=5.0)
    assert batch is not None and batch.requests[0].waiter == "b"


def test_zero_delay_dispatches_immediately() -> None:
    q = queue(size=32, delay=0)
    q.put(pending(1, at=3.0))
    batch = q.take(now=3.0)
    assert batch is not None and batch.size == 1


def test_queue_bound_counts_instances() -> None:
    q = queue(max_queue=5)
    q.put(pending(3))
    with pytest.raises(QueueFull) as info:
        q.put(pending(3))
    assert info.value.status == 503 and info.value.headers["Retry-After"] == "1"
    q.put(pending(2))
    assert q.queued_instances == 5


def test_expired_and_cancelled_requests_are_removed_before_compute() -> None:
    q = queue(size=8, delay=0.010)
    q.put(pending(1, at=0.0, deadline=0.005, tag="late"))
    q.put(pending(1, at=0.0, tag="gone"))
    q.put(pending(1, at=0.0, deadline=1.0, tag="ok"))
    q._lanes[0][1].cancelled = True
    assert q.wake_at() == pytest.approx(0.005)
    early = q.take(now=0.006)
    assert early is not None
    assert [r.waiter for r in early.expired] == ["late"]
    assert [r.waiter for r in early.dropped] == ["gone"]
    assert early.requests == [] and q.in_flight == 0
    batch = q.take(now=0.010)
    assert batch is not None and [r.waiter for r in batch.requests] == ["ok"]


class Leaving:
    """A client's `gone` flag that counts how often it is asked."""

    def __init__(self) -> None:
        self.left = False
        self.asked = 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.left


def test_a_request_whose_client_left_is_never_computed_even_between_looks_over_the_queue() -> None:
    q = queue(size=2, delay=0.0)
    client = Leaving()
    q.put(pending(1, tag="stays"))
    q.put(Pending(["left0"], 0.0, None, "left", gone=client))
    q.put(pending(1, tag="next"))
    first = q.take(now=0.0)  # the whole queue is looked at; nobody has left yet
    assert first is not None and [r.waiter for r in first.requests] == ["stays", "left"]
    q.done()
    client.left = True
    q.put(Pending(["left1"], 0.0, None, "left again", gone=client))
    q.put(pending(1, tag="last"))
    batch = q.take(now=SWEEP_S / 10)  # no look over the whole queue is due: each request is looked at as taken
    assert batch is not None
    assert [r.waiter for r in batch.requests] == ["next", "last"]
    assert [r.waiter for r in batch.dropped] == ["left again"]


def test_the_whole_queue_is_looked_at_once_per_sweep_not_on_every_take() -> None:
    """A crowd keeps hundreds queued and `take` runs on every arrival: asking each one whether its client has gone
    every time cost the event loop 12% of its time (py-spy, issue #16's (d))."""
    q = queue(size=4, delay=0.0, max_queue=1000)
    clients = [Leaving() for _ in range(200)]
    for index, client in enumerate(clients):
        q.put(Pending([index], 0.0, None, str(index), gone=client))
    assert q.take(now=0.0) is not None  # a batch goes out, after one look over everything
    asked = sum(c.asked for c in clients)
    assert asked >= 200
    for step in range(1, 10):  # arrivals between looks: the in-flight batch holds the next one back
        q.put(pending(1, tag=f"new{step}"))
        assert q.take(now=step * SWEEP_S / 20) is None
    assert sum(c.asked for c in clients) == asked
    clients[-1].left = True  # the last in line leaves: its place is freed at the next look, not when it comes up
    before = q.queued_instances
    taken = q.take(now=SWEEP_S)
    assert taken is not None and [r.waiter for r in taken.dropped] == ["199"]
    assert q.queued_instances == before - 1


# -- the asyncio driver ------------------------------------------------------------------------------------------
def run_async(coro: Any) -> Any:
    return asyncio.run(coro)


async def until(condition: Any) -> None:
    """Yield to the event loop until `condition()` holds (bounded)."""
    for _ in range(100_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


class GatedModel:
    """An async model that records what it computes and holds each batch until `gate` is set."""

    def __init__(self) -> None:
        self.computed: list[Any] = []
        self.gate = asyncio.Event()

    async def __call__(self, batch: list[Any]) -> list[Any]:
        self.computed.extend(batch)
        await self.gate.wait()
        return batch


def test_async_driver_batches_concurrent_requests_and_splits_results() -> None:
    seen: list[int] = []

    async def model(batch: list[Any]) -> list[Any]:
        seen.append(len(batch))
        await asyncio.sleep(0.01)
        return [x * 10 for x in batch]

    async def main() -> list[list[Any]]:
        batcher = AsyncBatcher(BatchQueue(8, 0.0, 100, 1), model)
        batcher.start()
        results = await asyncio.gather(*(batcher.submit([i, i + 100], None) for i in range(12)))
        await batcher.close()
        return list(results)

    results = run_async(main())
    assert results == [[i * 10, (i + 100) * 10] for i in range(12)]
    assert max(seen) > 2  # batches formed while the model was busy
    assert sum(seen) == 24


def test_async_driver_hands_a_batch_back_a_chunk_per_turn_of_the_loop() -> None:
    """The loop turns between chunks of a batch's answers, so it reads the connections that sent meanwhile (a
    high priority among them) after a few answers, not after the whole batch's."""

    async def main() -> list[int]:
        turns = 0

        def tick() -> None:
            nonlocal turns
            turns += 1
            loop.call_soon(tick)

        loop = asyncio.get_running_loop()
        loop.call_soon(tick)

        async def echo(batch: list[Any]) -> list[Any]:
            return batch

        size = 2 * ANSWER_CHUNK + 3
        batcher = AsyncBatcher(BatchQueue(size, 60.0, 100, 1), echo)
        batcher.start()

        async def one(i: int) -> int:
            assert await batcher.submit([i], None) == [i]
            return turns

        answered_at = await asyncio.gather(*(one(i) for i in range(size)))  # one full batch
        await batcher.close()
        return answered_at

    answered_at = run_async(main())
    chunks = [answered_at[i : i + ANSWER_CHUNK] for i in range(0, len(answered_at), ANSWER_CHUNK)]
    assert all(len(set(chunk)) == 1 for chunk in chunks)  # a chunk's answers in one turn, in the batch's order
    assert [chunk[0] for chunk in chunks] == sorted({chunk[0] for chunk in chunks})  # each chunk a later turn


def test_async_driver_fails_only_the_failing_batch() -> None:
    async def model(batch: list[Any]) -> list[Any]:
        if "boom" in batch:
            raise ModelFailed("exploded")
        return batch

    async def main() -> tuple[Any, ...]:
        batcher = AsyncBatcher(BatchQueue(1, 0.0, 100, 1), model)
        batcher.start()
        outcome = await asyncio.gather(
            batcher.submit(["a"], None),
            batcher.submit(["boom"], None),
            batcher.submit(["c"], None),
            return_exceptions=True,
        )
        await batcher.close()
        return tuple(outcome)

    a, boom, c = run_async(main())
    assert a == ["a"] and c == ["c"]
    assert isinstance(boom, ModelFailed)


def test_async_driver_checks_output_count() -> None:
    async def model(batch: list[Any]) -> list[Any]:
        return batch[:-1]

    async def main() -> Any:
        batcher = AsyncBatcher(BatchQueue(4, 0.0, 100, 1), model)
        batcher.start()
        try:
            return await batcher.submit([1, 2], None)
        finally:
            await batcher.close()

    with pytest.raises(OutputMismatch, match="returned 1 outputs for 2 inputs"):
        run_async(main())


def test_async_driver_expires_queued_requests_without_computing_them() -> None:
    async def main() -> tuple[Any, list[Any], list[Any]]:
        model = GatedModel()
        batcher = AsyncBatcher(BatchQueue(1, 0.0, 100, 1), model)
        batcher.start()
        first = asyncio.create_task(batcher.submit(["first"], None))
        await until(lambda: batcher.queue.in_flight == 1)
        outcome = await asyncio.gather(batcher.submit(["late"], time.monotonic() + 0.05), return_exceptions=True)
        model.gate.set()
        result = await first
        await batcher.close()
        return outcome[0], result, model.computed

    late, first, computed = run_async(main())
    assert isinstance(late, DeadlineExceeded) and late.status == 504
    assert first == ["first"]
    assert computed == ["first"]


def test_async_driver_deadline_passing_mid_batch_fails_only_that_request() -> None:
    """The deadline is a timer on the request's one future: it fails that request at its deadline while its batch
    computes; its batch-mate is answered, and so is a request answered before its deadline."""

    async def main() -> tuple[Any, list[Any], list[Any]]:
        model = GatedModel()
        batcher = AsyncBatcher(BatchQueue(2, 0.05, 100, 1), model)
        batcher.start()
        late = asyncio.create_task(batcher.submit(["late"], time.monotonic() + 0.2))
        patient = asyncio.create_task(batcher.submit(["patient"], None))
        await until(lambda: batcher.queue.in_flight == 1)
        outcome = await asyncio.gather(late, return_exceptions=True)
        model.gate.set()
        answered = await patient
        timely = await batcher.submit(["timely"], time.monotonic() + 30)
        await batcher.close()
        return outcome[0], answered, timely

    late, answered, timely = run_async(main())
    assert isinstance(late, DeadlineExceeded) and late.status == 504
    assert answered == ["patient"] and timely == ["timely"]


def test_async_driver_rejects_when_queue_is_full() -> None:
    async def main() -> Any:
        model = GatedModel()
        batcher = AsyncBatcher(BatchQueue(1, 0.0, 2, 1), model)
        batcher.start()
        tasks = [asyncio.create_task(batcher.submit([0], None))]
        await until(lambda: batcher.queue.in_flight == 1)
        tasks += [asyncio.create_task(batcher.submit([i], None)) for i in (1, 2)]
        await until(lambda: batcher.queue.queued_instances == 2)  # the queue is full
        with pytest.raises(QueueFull):
            await batcher.submit([99], None)
        model.gate.set()
        results = await asyncio.gather(*tasks)
        await batcher.close()
        return results, batcher.stats.rejected

    results, rejected = run_async(main())
    assert results == [[0], [1], [2]] and rejected == 1


# -- the thread driver -------------------------------------------------------------------------------------------
def test_thread_driver_batches_across_threads() -> None:
    seen: list[int] = []
    lock = threading.Lock()

    def model(batch: list[Any]) -> list[Any]:
        with lock:
            seen.append(len(batch))
        time.sleep(0.005)  # a model that takes time, so batches form while it runs
        return [x + 1 for x in batch]

    batcher = ThreadBatcher(BatchQueue(16, 0.002, 1000, 1), model, workers=1)
    results: dict[int, list[Any]] = {}

    def client(i: int) -> None:
        results[i] = batcher.submit([i, -i], None)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    batcher.close()
    assert results == {i: [i + 1, -i + 1] for i in range(24)}
    assert max(seen) > 2 and sum(seen) == 48


def test_thread_driver_deadline_and_errors() -> None:
    gate = threading.Event()

    def model(batch: list[Any]) -> list[Any]:
        if batch == ["boom"]:
            raise ModelFailed("exploded")
        gate.wait(timeout=30)
        return batch

    batcher = ThreadBatcher(BatchQueue(1, 0.0, 100, 1), model, workers=1)
    with pytest.raises(ModelFailed):
        batcher.submit(["boom"], None)
    blocker = threading.Thread(target=batcher.submit, args=(["slow"], None))
    blocker.start()
    with pytest.raises(DeadlineExceeded):
        batcher.submit(["late"], time.monotonic() + 0.05)
    gate.set()
    blocker.join(timeout=30)
    assert batcher.submit(["after"], None) == ["after"]
    batcher.close()


def test_async_driver_drops_requests_whose_client_has_gone() -> None:
    async def main() -> Any:
        model = GatedModel()
        batcher = AsyncBatcher(BatchQueue(1, 0.0, 100, 1), model)
        batcher.start()
        busy = asyncio.create_task(batcher.submit(["busy"], None))
        await until(lambda: batcher.queue.in_flight == 1)
        client_left = False
        gone = asyncio.create_task(batcher.submit(["gone"], None, gone=lambda: client_left))
        await until(lambda: len(batcher.queue) == 1)
        client_left = True
        model.gate.set()
        outcome = await asyncio.gather(busy, gone, return_exceptions=True)
        await batcher.close()
        return outcome, batcher.stats.cancelled, model.computed

    (busy, gone), cancelled, computed = run_async(main())
    assert busy == ["busy"]
    assert isinstance(gone, ClientDisconnected)
    assert computed == ["busy"] and cancelled == 1


def test_async_driver_closes_at_once_when_closed_as_it_answers() -> None:
    """`close` right after an answer, while the collector waits with a timeout (a request with a deadline is
    queued): on Python 3.11 asyncio.wait_for swallowed that cancellation, the collector went on, and `close`
    waited for it for ever."""

    async def main() -> tuple[list[Any], Any]:
        model = GatedModel()
        batcher = AsyncBatcher(BatchQueue(1, 0.0, 100, 1), model)
        batcher.start()
        first = asyncio.create_task(batcher.submit(["first"], None))
        await until(lambda: batcher.queue.in_flight == 1)
        queued = asyncio.create_task(batcher.submit(["queued"], time.monotonic() + 3600))
        await until(lambda: len(batcher.queue) == 1)
        model.gate.set()
        answered = await first
        await batcher.close()
        return answered, (await asyncio.gather(queued, return_exceptions=True))[0]

    answered, queued = run_async(main())  # the test's own timeout fails a close that never returns
    assert answered == ["first"]
    assert queued == ["queued"] or "shutting down" in str(queued)  # computed before the close, or failed by it
