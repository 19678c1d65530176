"""The pipe to hybrid's model workers (`core/wire.py`, `ProcessPool.acall`): one frame per message, numpy arrays
out of band and back intact and writable, from the loop and from a thread; a worker's death fails only its batch."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from pydantic import BaseModel, ConfigDict, PrivateAttr

from tests.models import Point
from twinserve.config import load_config
from twinserve.core import wire
from twinserve.core.workers import LOOP_FRAME_BYTES, ProcessPool
from twinserve.errors import WorkerDied

ARRAYS = "tests.models:ArrayDoubler"


def _arrays() -> list[Any]:
    grid = np.arange(12, dtype=np.float32).reshape(3, 4)
    return [grid, np.asfortranarray(grid), grid[:, 1], np.array(7, dtype=np.int64), np.zeros(0, dtype=np.uint8)]


def test_a_frame_carries_arrays_out_of_band_and_gives_them_back_writable() -> None:
    arrays = _arrays()
    frame = wire.encode(wire.PredictBatch(("r1",), arrays))
    assert frame[:1] == b"\x01"  # out of band
    message = wire.decode(frame)
    assert message.request_ids == ("r1",)
    for sent, got in zip(arrays, message.instances, strict=True):
        assert got.dtype == sent.dtype and got.shape == sent.shape and np.array_equal(got, sent)
        assert got.flags.writeable
    assert message.instances[1].flags.f_contiguous


def test_a_message_without_buffers_is_one_plain_pickle() -> None:
    reply = wire.BatchReply(outputs=[{"a": 1}, "b"])
    frame = wire.encode(reply)
    assert frame[:1] == b"\x00"
    assert pickle.loads(frame[1:]) == reply == wire.decode(frame)


@pytest.fixture(scope="module")
def pool() -> Iterator[ProcessPool]:
    pool = ProcessPool(ARRAYS, load_config(arch="hybrid", models=[ARRAYS]), 1)
    pool.start()
    yield pool
    pool.close()


def test_a_batch_of_arrays_crosses_to_a_model_worker_and_back_from_a_thread(pool: ProcessPool) -> None:
    outputs = pool.call(_arrays())
    for sent, got in zip(_arrays(), outputs, strict=True):
        assert got.dtype == sent.dtype and np.array_equal(got, sent * 2)


def test_a_batch_of_arrays_crosses_from_the_event_loop_small_and_large(pool: ProcessPool) -> None:
    large = np.ones(LOOP_FRAME_BYTES // 8 + 1, dtype=np.float64)  # past the loop's frame size: sent from a thread

    async def both() -> tuple[list[Any], list[Any]]:
        with ThreadPoolExecutor(1) as waiters:
            return await pool.acall(_arrays(), waiters), await pool.acall([large], waiters)

    small_out, large_out = asyncio.run(both())
    for sent, got in zip(_arrays(), small_out, strict=True):
        assert np.array_equal(got, sent * 2)
    assert np.array_equal(large_out[0], large * 2)


def test_a_worker_dying_on_the_loop_fails_its_batch_and_is_replaced(pool: ProcessPool) -> None:
    before = pool.pids()
    replaced = pool.replaced

    async def die_then_compute() -> list[Any]:
        with ThreadPoolExecutor(1) as waiters:
            with pytest.raises(WorkerDied, match=f"pid {before[0]}"):
                await pool.acall(["die"], waiters)
            return await pool.acall([np.arange(3)], waiters)  # waits (on a thread) for the replacement

    assert np.array_equal(asyncio.run(die_then_compute())[0], np.arange(3) * 2)
    assert pool.replaced == replaced + 1 and pool.pids() != before


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)
    a: int
    inner: Point | None = None


class Extra(BaseModel):
    model_config = ConfigDict(extra="allow")
    a: int


class Private(BaseModel):
    a: int
    _seen: int = PrivateAttr(default=0)


def test_pydantic_models_cross_as_their_values_and_come_back_equal() -> None:
    frozen = Frozen(a=1, inner=Point(x=1, y=2))
    extra = Extra(a=1, b=2)
    private = Private(a=1)
    private._seen = 3
    sent = [frozen, Frozen(a=2), extra, private]
    got = wire.decode(wire.encode(wire.BatchReply(outputs=sent))).outputs
    assert got == sent
    assert got[0].model_fields_set == {"a", "inner"} and got[1].model_fields_set == {"a"}
    assert hash(got[1]) == hash(sent[1])
    with pytest.raises(ValueError, match="frozen"):
        got[0].a = 5
    assert got[2].model_extra == {"b": 2} and got[3]._seen == 3  # pydantic's own pickling kept these
