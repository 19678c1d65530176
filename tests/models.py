"""Models used by the tests, served through the `path/file.py:Class` form of MODEL."""

from __future__ import annotations

import asyncio
import gc
import logging
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel

import twinserve
from twinserve import Tensor


class Echo(twinserve.Model):
    """Returns each instance unchanged: any JSON in, the same JSON out."""

    def predict(self, batch: list[Any]) -> list[Any]:
        return list(batch)


class AsyncEcho:
    """Every hook a coroutine, and no base class: the sync front must run them on its per-thread loop."""

    name = "async-echo"

    async def load(self) -> None:
        await asyncio.sleep(0)
        self.loaded_in = "async load"

    async def preprocess(self, instance: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {**instance, "preprocessed": True}

    async def predict(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        await asyncio.sleep(0)
        return [{**item, "by": self.loaded_in} for item in batch]


class Point(BaseModel):
    x: int
    y: int


class Mixed(twinserve.Model):
    """Blocking predict, coroutine preprocess: each front must cross over once."""

    async def preprocess(self, instance: Point) -> int:
        await asyncio.sleep(0)
        return instance.x * instance.y

    def predict(self, batch: list[int]) -> list[int]:
        return [value + 1 for value in batch]


class Faulty(twinserve.Model):
    """Raises on an instance equal to "boom"."""

    def predict(self, batch: list[str]) -> list[str]:
        if "boom" in batch:
            raise RuntimeError("exploded on purpose")
        return [s.upper() for s in batch]


class Mismatch(twinserve.Model):
    """Returns one output too few."""

    def predict(self, batch: list[int]) -> list[int]:
        return batch[:-1]


class Gate(twinserve.Model):
    """Blocks inside predict until the test releases it: `{"gate": "/tmp/x"}` touches /tmp/x.started and waits
    for /tmp/x.release (at most 60 s). Lets tests act while requests are provably in flight, with no sleeps."""

    def predict(self, batch: list[dict[str, str]]) -> list[str]:
        for item in batch:
            _hold(Path(item["gate"]))
        return ["released" for _ in batch]


def _hold_gates(batch: list[Any]) -> None:
    """Hold on each `{"gate": path}` instance of the batch, as Gate does; other instances pass."""
    for item in batch:
        if isinstance(item, dict) and "gate" in item:
            _hold(Path(item["gate"]))


def _hold(gate: Path) -> None:
    # Written whole, then renamed into place: a test that waits for the file to appear reads the pid, never the
    # empty file `write_text` creates before it writes (seen under load). One temporary per process and thread:
    # requests through the same gate may start at once.
    started = gate.with_suffix(".started")
    writing = gate.with_suffix(f".started-{os.getpid()}-{threading.get_ident()}")
    writing.write_text(str(os.getpid()))
    os.replace(writing, started)
    deadline = time.monotonic() + 60
    while not gate.with_suffix(".release").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("gate never released")
        time.sleep(0.01)


class Poison(twinserve.Model):
    """Upper-cases strings, and raises for any batch holding the string "poison". A `{"gate": path}` instance
    holds predict as Gate does, so that tests can queue good and poison requests into one batch behind it."""

    def predict(self, batch: list[Any]) -> list[str]:
        _hold_gates(batch)
        if "poison" in batch:
            raise RuntimeError("poisoned batch")
        return ["released" if isinstance(item, dict) else str(item).upper() for item in batch]


class PoisonWhole(Poison):
    """Poison with failure isolation turned off: a poisoned batch fails for every request in it."""

    name = "poison-whole"
    isolate_failures = False


class BatchRecorder(twinserve.Model):
    """Tells each instance which predict call (process and call number) computed it, and that call's size. A
    `{"gate": path}` instance holds its call as Gate does, so that a test can queue requests behind it."""

    def load(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    def predict(self, batch: list[Any]) -> list[dict[str, Any]]:
        with self.lock:
            self.calls += 1
            call = f"{os.getpid()}-{self.calls}"
        _hold_gates(batch)
        time.sleep(0.02)  # the model's own compute time: requests arriving meanwhile form the next batch
        return [{"input": item, "call": call, "size": len(batch)} for item in batch]


class WhereAmI(twinserve.Model):
    """Reports the process and thread that ran predict."""

    name = "where"

    def predict(self, batch: list[Any]) -> list[dict[str, Any]]:
        thread = threading.current_thread()
        process = multiprocessing.current_process().name
        return [{"process": process, "thread": thread.name, "main": thread is threading.main_thread()} for _ in batch]


class HeapState(twinserve.Model):
    """Reports the garbage collector's state in the process that ran predict: whether what `load` made is frozen
    (out of every collection's walk: `gc.get_objects` lists the three generations, not the frozen objects), and the
    youngest generation's threshold."""

    name = "heap"

    def load(self) -> None:
        self.made_in_load: list[int] = []

    def predict(self, batch: list[Any]) -> list[dict[str, Any]]:
        frozen = not any(obj is self.made_in_load for obj in gc.get_objects())
        state = {"frozen": frozen, "young_threshold": gc.get_threshold()[0], "pid": os.getpid()}
        return [state for _ in batch]


#: The file a `LoadGate` model's load() waits for (its name from the environment: hybrid loads in model workers).
LOAD_GATE_ENV = "TWINSERVE_TEST_LOAD_GATE"


class LoadGate(twinserve.Model):
    """Its load() touches `<gate>.loading` and returns once the file the environment names in `LOAD_GATE_ENV`
    appears (at most 120 s): a load as long as the test wants, with no sleep in the test."""

    name = "loadgate"

    def load(self) -> None:
        gate = Path(os.environ[LOAD_GATE_ENV])
        gate.with_suffix(".loading").touch()
        deadline = time.monotonic() + 120
        while not gate.exists():
            if time.monotonic() > deadline:
                raise TimeoutError("the load gate never opened")
            time.sleep(0.01)

    def predict(self, batch: list[Any]) -> list[Any]:
        return batch


class Chatty(twinserve.Model):
    """Logs from inside predict, through plain stdlib logging, as a user's model would."""

    def predict(self, batch: list[float]) -> list[float]:
        logging.getLogger("chatty").info("chatty computing %d", len(batch))
        return [x * 2 for x in batch]


class FailsToLoad(twinserve.Model):
    def load(self) -> None:
        raise RuntimeError("model load failed on purpose")

    def predict(self, batch: list[Any]) -> list[Any]:
        return batch


class Affine(twinserve.Model):
    """Declares its V2 tensors and converts them itself: each row of `x` times its `scale`, and the row's total."""

    inputs = (Tensor("x", "FP64", [-1, 2]), Tensor("scale", "FP64", [-1]))
    outputs = (Tensor("y", "FP64", [-1, 2]), Tensor("total", "FP64", [-1]))

    def from_tensors(self, arrays: dict[str, np.ndarray[Any, Any]]) -> list[dict[str, Any]]:
        return [{"x": x, "scale": s} for x, s in zip(arrays["x"].tolist(), arrays["scale"].tolist(), strict=True)]

    def predict(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"y": [value * item["scale"] for value in item["x"]]} for item in batch]

    def to_tensors(self, outputs: list[dict[str, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        y = np.array([o["y"] for o in outputs], dtype=np.float64)
        return {"y": y, "total": y.sum(axis=1)}


class Reading(BaseModel):
    sensor: str
    values: list[float]


class Summary(BaseModel):
    sensor: str
    count: int
    mean: float
    ok: bool
    extremes: list[float] = [0.0, 0.0]
    notes: dict[str, Any] = {}


class Sensors(twinserve.Model):
    """No declared tensors, types that derive to several: JSON text in, one tensor per output field out."""

    def predict(self, batch: list[Reading]) -> list[Summary]:
        return [
            Summary(
                sensor=r.sensor,
                count=len(r.values),
                mean=sum(r.values) / len(r.values),
                ok=all(v >= 0 for v in r.values),
                extremes=[min(r.values), max(r.values)],
                notes={"first": r.values[0]},
            )
            for r in batch
        ]


class Pickled(twinserve.Model):
    """A scikit-learn model from the joblib file named by $PICKLED_MODEL, through twinserve.load_pickle."""

    def load(self) -> None:
        self.clf = twinserve.load_pickle(os.environ["PICKLED_MODEL"], self.config)

    def predict(self, batch: list[list[float]]) -> list[int]:
        return [int(label) for label in self.clf.predict(np.array(batch))]


class DripControl(BaseModel):
    """How a `Drip` stream behaves; the first instance of a batch steers the whole call."""

    dir: str  # where the model writes its markers (and the test its gate)
    tag: str = ""
    steps: int = 3
    gate_at: int | None = None  # before this step: touch `waiting`, wait for the test to touch `release`
    fail_at: int | None = None  # this step raises
    bad_at: int | None = None  # this step yields one chunk too many
    die_at: int | None = None  # this step kills the process (only for model-worker processes)
    pause_s: float = 0.0  # each step's own compute time


class Drip(twinserve.Model):
    """A blocking generator that leaves a trace in `dir`: one line in `steps` per step computed, and `closed`
    (written by its `finally`) saying how it ended."""

    def predict(self, batch: list[DripControl]) -> Iterator[list[str]]:
        control, trace = batch[0], _DripTrace(batch[0].dir)
        try:
            for i in range(control.steps):
                if i == control.gate_at:
                    trace.wait_for_release()
                time.sleep(control.pause_s)
                step = trace.step(control, i, batch)
                yield step
            trace.ended = "finished"
        finally:
            trace.close()


class AsyncDrip(twinserve.Model):
    """`Drip` as an async generator: awaits between steps, so the event loop can cancel it there."""

    name = "async-drip"

    async def predict(self, batch: list[DripControl]) -> AsyncIterator[list[str]]:
        control, trace = batch[0], _DripTrace(batch[0].dir)
        try:
            for i in range(control.steps):
                if i == control.gate_at:
                    await asyncio.to_thread(trace.wait_for_release)
                await asyncio.sleep(control.pause_s)
                yield trace.step(control, i, batch)
            trace.ended = "finished"
        finally:
            trace.close()


class _DripTrace:
    def __init__(self, directory: str) -> None:
        self.dir = Path(directory)
        self.ended = "stopped early"

    def wait_for_release(self) -> None:
        (self.dir / "waiting").touch()
        deadline = time.monotonic() + 60
        while not (self.dir / "release").exists():
            if time.monotonic() > deadline:
                raise TimeoutError("never released")
            time.sleep(0.01)

    def step(self, control: DripControl, i: int, batch: list[DripControl]) -> list[str]:
        if i == control.fail_at:
            self.ended = "failed"
            raise RuntimeError(f"step {i} failed on purpose")
        if i == control.die_at:
            os._exit(1)
        with (self.dir / "steps").open("a") as steps:
            steps.write(f"{i}\n")
        chunks = [f"{item.tag}-{i}" for item in batch]
        return [*chunks, "extra"] if i == control.bad_at else chunks

    def close(self) -> None:
        steps = self.dir / "steps"
        count = len(steps.read_text().splitlines()) if steps.exists() else 0
        # Written whole, then renamed: a test that waits for the file to appear never reads it empty.
        partial = self.dir / "closed.partial"
        partial.write_text(f"{self.ended} after {count} steps")
        partial.replace(self.dir / "closed")


class Slow(twinserve.Model):
    """Takes half a second per predict call: a model slower than a 100 ms deadline."""

    def predict(self, batch: list[Any]) -> list[Any]:
        time.sleep(0.5)  # the model's own compute time
        return list(batch)


#: What a model's exception may carry that no client should read: a credential, a host, a path.
SECRET = "postgres://admin:sk-live-4242@db.internal/prod from /srv/app/secret_config.py"


class Leaky(twinserve.Model):
    """Raises with a secret in its text on "secret"; with its batch's inputs in the text on "convert"; streams on
    `:stream` (the error after its first step); each stage its own instance: "pre-secret" raises in preprocess."""

    isolate_failures = False  # a shared batch fails as a whole: the case where one client's input could leak

    def preprocess(self, instance: str) -> str:
        if instance == "pre-secret":
            raise RuntimeError(f"cannot reach {SECRET}")
        return instance

    def predict(self, batch: list[str]) -> list[str]:
        if "secret" in batch:
            raise RuntimeError(f"cannot reach {SECRET}")
        if any(instance.startswith("A-") for instance in batch):
            raise ValueError(f"could not convert string to float: {batch!r}")
        return [instance.upper() for instance in batch]


class LeakyStream(twinserve.Model):
    """A stream whose second step raises with a secret in its text."""

    def predict(self, batch: list[str]) -> Iterator[list[str]]:
        yield [instance.upper() for instance in batch]
        raise RuntimeError(f"cannot reach {SECRET}")


class RawBytes(twinserve.Model):
    """Takes raw bytes (V2 BYTES [-1]): each instance's length and its first byte, to show nothing was re-encoded."""

    name = "raw-bytes"

    def predict(self, batch: list[bytes]) -> list[list[int]]:
        return [[len(b), b[0] if b else -1] for b in batch]


class Counters(twinserve.Model):
    """UINT64 tensors in and out, unchanged."""

    name = "counters"
    inputs = (Tensor("input", "UINT64", [-1]),)
    outputs = (Tensor("output", "UINT64", [-1]),)

    def from_tensors(self, arrays: dict[str, np.ndarray[Any, Any]]) -> list[int]:
        return [int(v) for v in arrays["input"].tolist()]

    def predict(self, batch: list[int]) -> list[int]:
        return list(batch)

    def to_tensors(self, outputs: list[int]) -> dict[str, np.ndarray[Any, Any]]:
        return {"output": np.array(outputs, dtype=np.uint64)}


class ServerWideSetting:
    """A per-model setting that only the server may have: refused at start-up, naming the key."""

    settings: ClassVar[dict[str, Any]] = {"port": 9000}

    def predict(self, batch: list[Any]) -> list[Any]:
        return list(batch)


class ArrayDoubler(twinserve.Model):
    """Doubles each numpy array in place (so it must arrive writable) and returns it; `"die"` exits the process."""

    def predict(self, batch: list[Any]) -> list[Any]:
        if any(isinstance(item, str) and item == "die" for item in batch):
            os._exit(1)
        for item in batch:
            item *= 2
        return list(batch)


class MathThreads(twinserve.Model):
    """Reports the threads each math library loaded where predict runs may use (torch too, where installed)."""

    name = "math-threads"

    def load(self) -> None:
        import importlib.util

        if importlib.util.find_spec("torch") is not None:  # a model that imports torch in load, as MiniLM does
            import torch  # noqa: F401

    def predict(self, batch: list[Any]) -> list[dict[str, int]]:
        from threadpoolctl import threadpool_info

        found = {f"{i['internal_api']}:{i['prefix']}": int(i["num_threads"]) for i in threadpool_info()}
        torch = sys.modules.get("torch")
        if torch is not None:
            found["torch"] = int(torch.get_num_threads())
        return [found for _ in batch]


class MatMul(twinserve.Model):
    """Multiplies a 300x300 matrix by itself once per instance: BLAS computes on every core it may use."""

    name = "matmul"

    def load(self) -> None:
        self.matrix = np.random.default_rng(0).random((300, 300))

    def predict(self, batch: list[Any]) -> list[float]:
        return [float(np.trace(self.matrix @ self.matrix)) for _ in batch]


class Inflate(twinserve.Model):
    """A small request, a large reply: n in, a string of n "x" out; a string in comes back as it is (a large
    request)."""

    def predict(self, batch: list[int | str]) -> list[str]:
        return [item if isinstance(item, str) else "x" * item for item in batch]


class _Point(BaseModel):
    x: float
    y: float


def _returned(spec: Any) -> Any:
    """The value a `Returns` instance describes (tests/contract/test_equal_answers.py)."""
    if not isinstance(spec, dict):
        return spec
    kind = spec["kind"]
    if kind == "array":
        values = spec["values"]
        if spec["dtype"].startswith("complex"):  # [real, imag] pairs: JSON has no complex numbers
            values = [complex(*pair) for pair in values]
        array = np.array(values, dtype=spec["dtype"]).reshape(spec["shape"])
        view = spec.get("view")
        if view == "transposed":
            return array.T
        if view == "strided":
            return array[..., ::2]
        return array
    if kind == "scalar":
        return np.array(spec["value"], dtype=spec["dtype"])[()]
    if kind == "zero-d":
        return np.array(spec["value"], dtype=spec["dtype"])
    if kind == "list":
        return [_returned(item) for item in spec["items"]]
    if kind == "dict":
        return {key: _returned(value) for key, value in spec["items"].items()}
    if kind == "bytes":
        return spec["value"].encode()
    if kind == "pydantic":
        return _Point(x=spec["x"], y=spec["y"])
    if kind == "torch":
        import torch

        return torch.tensor(spec["values"], dtype=getattr(torch, spec["dtype"]))
    raise ValueError(f"no such kind {kind!r}")


class Returns(twinserve.Model):
    """Returns what each instance describes: a numpy array of a dtype, shape and view (plain, transposed, strided),
    a numpy scalar, a 0-d array, a list or dict of them, bytes, a pydantic model, a torch tensor. With `column` in
    the first instance, the whole batch's answer is one column of a numpy table: a strided view, the everyday
    `proba[:, 0]`."""

    name = "returns"

    def predict(self, batch: list[Any]) -> Any:
        first = batch[0]
        if isinstance(first, dict) and "column" in first:
            table = np.arange(2 * len(batch)).astype(first["column"]).reshape(len(batch), 2)
            return table[:, 0]
        return [_returned(spec) for spec in batch]
