"""`--device`: its spelling, how `auto` and `cuda` resolve (a faked machine), the start-up errors, `self.device` in
every architecture, and the per-thread streams (a faked CUDA backend at the `DeviceBackend` seam)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import twinserve
from tests.conftest import ARCHS
from tests.inprocess import served
from tests.serving import ROOT
from twinserve.config import load_config
from twinserve.core import device as device_module
from twinserve.core.device import CpuBackend, CudaBackend, Placement, current_placement, resolve_device, to_device
from twinserve.core.executors import ModelHandle, ThreadExecutor
from twinserve.core.runtime import ModelRuntime
from twinserve.errors import ConfigError, MissingExtra
from twinserve.model import ModelSpec

DEVICE_REPORT = "tests.live.test_device:DeviceReport"


class DeviceReport(twinserve.Model):
    """Says the device it was given at load and at predict, and the placement its batch ran under."""

    name = "device"

    def load(self) -> None:
        self.loaded_on = self.device

    def predict(self, batch: list[Any]) -> list[dict[str, Any]]:
        placement = current_placement()
        placed = None if placement is None else placement.device
        return [{"device": self.device, "loaded_on": self.loaded_on, "placed": placed} for _ in batch]


# -- the setting --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:0", "cuda:12", "auto"])
def test_the_device_setting_takes_cpu_cuda_cuda_n_and_auto(device: str) -> None:
    assert load_config(device=device).device == device


@pytest.mark.parametrize("device", ["gpu", "CPU", "cuda:", "cuda:x", "cuda0", "mps", ""])
def test_another_device_is_a_config_error_naming_the_flag(device: str) -> None:
    with pytest.raises(ConfigError, match=r"^--device: .*expected cpu, cuda, cuda:N or auto"):
        load_config(device=device)


def test_the_device_defaults_to_cpu_and_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_config().device == "cpu"
    monkeypatch.setenv("TWINSERVE_DEVICE", "auto")
    assert load_config().device == "auto"


# -- resolution, on a faked machine -------------------------------------------------------------------------------
class FakeMachine:
    def __init__(self, torch: bool, gpus: int) -> None:
        self.torch, self.gpus = torch, gpus
        self.asked = 0

    def torch_installed(self) -> bool:
        self.asked += 1
        return self.torch

    def device_count(self) -> int:
        assert self.torch, "device_count needs torch"
        return self.gpus


def test_cpu_never_asks_the_machine() -> None:
    machine = FakeMachine(torch=True, gpus=1)
    assert resolve_device("cpu", machine) == "cpu"
    assert machine.asked == 0


@pytest.mark.parametrize(("torch", "gpus", "device"), [(False, 0, "cpu"), (True, 0, "cpu"), (True, 2, "cuda")])
def test_auto_is_cuda_only_when_torch_sees_a_gpu(torch: bool, gpus: int, device: str) -> None:
    assert resolve_device("auto", FakeMachine(torch, gpus)) == device


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_is_kept_when_the_gpu_is_there(device: str) -> None:
    assert resolve_device(device, FakeMachine(torch=True, gpus=2)) == device


def test_cuda_without_torch_names_the_extra() -> None:
    message = r"^--device cuda needs the 'torch' extra: pip install 'twinserve\[torch\]'$"
    with pytest.raises(MissingExtra, match=message):
        resolve_device("cuda", FakeMachine(torch=False, gpus=0))


def test_cuda_without_a_gpu_or_past_the_gpus_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"^--device cuda: torch sees no CUDA device here"):
        resolve_device("cuda", FakeMachine(torch=True, gpus=0))
    with pytest.raises(ConfigError, match=r"^--device cuda:2: only 2 CUDA device\(s\) visible \(cuda:0\.\.cuda:1\)$"):
        resolve_device("cuda:2", FakeMachine(torch=True, gpus=2))


# -- start-up errors, from the command line -----------------------------------------------------------------------
def _serve(argv: list[str], hidden: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    code = f"import sys; [sys.modules.__setitem__(m, None) for m in {hidden!r}]; from twinserve.cli import main; "
    code += f"sys.exit(main({argv!r}))"
    environ = {**os.environ, **(env or {})}
    command = [sys.executable, "-c", code]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT, env=environ)


@pytest.mark.parametrize("arch", ARCHS)
def test_cuda_without_torch_fails_at_start_up_in_one_line(arch: str) -> None:
    done = _serve(["serve", "--arch", arch, "--device", "cuda:0", "--port", "1"], hidden=["torch"])
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        "twinserve: error: --device cuda:0 needs the 'torch' extra: pip install 'twinserve[torch]'"
    )


@pytest.mark.torch
def test_cuda_where_torch_sees_no_gpu_fails_at_start_up_in_one_line() -> None:
    # No GPU visible, on any machine: torch's count (NVML's or CUDA's) honours CUDA_VISIBLE_DEVICES.
    argv = ["serve", "--arch", "hybrid", "--device", "cuda", "--port", "1"]
    done = _serve(argv, hidden=[], env={"CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "twinserve: error: --device cuda: torch sees no CUDA device here (use --device cpu or auto)"
    ]


# -- what the model sees, in every architecture -------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("flags", [{}, {"max_batch_size": 4}], ids=["default-batching", "batch-4"])
def test_the_model_sees_its_device_at_load_and_in_predict(arch: str, flags: dict[str, Any]) -> None:
    with served(arch, [DEVICE_REPORT], device="cpu", **flags) as client:
        answer = client.request("POST", "/v1/models/device:predict", json={"instances": [1, 2]})
    assert answer.status == 200, answer.text
    assert answer.json()["predictions"] == [{"device": "cpu", "loaded_on": "cpu", "placed": "cpu"}] * 2


def test_auto_resolves_once_here_and_the_model_sees_the_result() -> None:
    with served("async", [DEVICE_REPORT], device="auto") as client:
        answer = client.request("POST", "/v1/models/device:predict", json={"instances": [1]})
    assert answer.status == 200, answer.text
    device = resolve_device("auto")
    assert answer.json()["predictions"] == [{"device": device, "loaded_on": device, "placed": device}]


def test_the_labs_in_process_measurement_gives_the_model_its_device_before_load() -> None:
    """`twinserve tune` and `bench` time predict in-process first (lab/ceiling.py): MiniLM's load reads
    self.device, as every model may."""
    from twinserve.lab.ceiling import measure

    rows = measure(DEVICE_REPORT, [b'{"instances": [1]}'], [1, 2], budget_s=0.01)
    assert [r.batch_size for r in rows] == [1, 2]


def test_core_imports_no_torch() -> None:
    code = (
        "import sys, twinserve.core.runtime, twinserve.core.device as d, twinserve.core.workers; "
        "p = d.Placement(d.resolve_device('cpu'))\nwith p.computing(): pass\n"
        "sys.exit('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr


# -- streams, behind a faked CUDA backend -------------------------------------------------------------------------
class FakeStream:
    def __init__(self, number: int) -> None:
        self.number = number


class FakeCuda:
    """A `DeviceBackend` that records what a CUDA one would be asked: streams made, made current, waited on."""

    def __init__(self) -> None:
        self.made: list[FakeStream] = []
        self.synchronized: list[FakeStream | None] = []
        self.pinned: list[Any] = []
        self._local = threading.local()
        self._lock = threading.Lock()

    def current(self) -> FakeStream | None:
        return getattr(self._local, "stream", None)

    def stream(self) -> FakeStream:
        with self._lock:
            self.made.append(FakeStream(len(self.made)))
            return self.made[-1]

    @contextmanager
    def use(self, stream: FakeStream) -> Iterator[None]:
        before, self._local.stream = self.current(), stream
        try:
            yield
        finally:
            self._local.stream = before

    def pin(self, tensor: Any) -> Any:
        self.pinned.append(tensor)
        return tensor

    def move(self, tensor: Any) -> Any:
        return ("on cuda:0", self.current(), tensor)

    def synchronize(self, stream: FakeStream | None = None) -> None:
        with self._lock:
            self.synchronized.append(stream)


def test_each_thread_computes_on_a_stream_of_its_own_and_keeps_it() -> None:
    fake = FakeCuda()
    placement = Placement("cuda:0", fake)
    seen: dict[str, list[FakeStream | None]] = {}
    start = threading.Barrier(3)

    def worker() -> None:
        start.wait(timeout=10)
        for _ in range(2):
            with placement.computing():
                assert current_placement() is placement
                seen.setdefault(threading.current_thread().name, []).append(fake.current())
            assert fake.current() is None and current_placement() is None

    threads = [threading.Thread(target=worker, name=f"model-worker-{i}") for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(fake.made) == 3  # one per thread, made on its first batch
    streams = [batches[0] for batches in seen.values()]
    assert len({id(stream) for stream in streams}) == 3
    for batches in seen.values():
        assert batches[0] is batches[1] is not None  # the same stream for the thread's every batch
    # each batch waited for its own stream at its end, never for the whole device
    assert sorted(id(s) for s in fake.synchronized) == sorted(id(s) for s in streams for _ in range(2))


def test_a_failing_batch_leaves_its_stream_and_placement() -> None:
    fake = FakeCuda()
    placement = Placement("cuda:0", fake)
    with pytest.raises(RuntimeError), placement.computing():
        raise RuntimeError("predict failed")
    assert fake.current() is None and current_placement() is None
    assert fake.synchronized == []
    placement.loaded()
    assert fake.synchronized == [None]  # after load: the whole device


class Rendezvous:
    """Two batches that must compute at the same time (each waits for the other), reporting their stream."""

    def __init__(self, fake: FakeCuda) -> None:
        self.fake = fake
        self.both = threading.Barrier(2)

    def predict(self, batch: list[int]) -> list[int]:
        self.both.wait(timeout=10)
        stream = self.fake.current()
        assert stream is not None
        return [stream.number for _ in batch]


def test_the_thread_executor_runs_concurrent_batches_on_their_own_streams() -> None:
    fake = FakeCuda()
    model = Rendezvous(fake)
    config = load_config(arch="async", model_workers=2)
    executor = ThreadExecutor(ModelHandle("unused:Rendezvous", ModelSpec(model), config, Placement("cuda:0", fake)))

    async def two_batches() -> list[Any]:
        return list(await asyncio.gather(executor.arun([1]), executor.arun([2, 3])))

    try:
        first, second = asyncio.run(two_batches())
    finally:
        executor.close()
    assert {first[0], second[0]} == {0, 1}  # two pool threads, two streams
    assert second[0] == second[1]


class StreamReport(twinserve.Model):
    """Says the number of the (fake) stream its batch ran on."""

    name = "streams"

    def predict(self, batch: list[Any]) -> list[int]:
        placement = current_placement()
        assert placement is not None
        stream = placement.backend.current()  # type: ignore[attr-defined]  # FakeCuda's
        return [stream.number for _ in batch]


@pytest.mark.parametrize("max_batch_size", [1, 4], ids=["request-thread", "batcher-threads"])
def test_the_sync_runtime_computes_each_thread_on_its_own_stream(max_batch_size: int) -> None:
    fake = FakeCuda()
    runtime = ModelRuntime(
        "tests.live.test_device:StreamReport", load_config(arch="sync", max_batch_size=max_batch_size)
    )
    runtime.placement = Placement("cuda:0", fake)
    runtime.load()
    seen: dict[str, list[int]] = {}

    def requests() -> None:
        seen[threading.current_thread().name] = [runtime.predict([1])[0] for _ in range(2)]

    try:
        for number in range(2):  # one after the other: the batcher reuses its thread, request threads differ
            thread = threading.Thread(target=requests, name=f"request-{number}")
            thread.start()
            thread.join(timeout=30)
    finally:
        runtime.close()
    streams = [number for numbers in seen.values() for number in numbers]
    assert len(streams) == 4 and set(streams) <= {stream.number for stream in fake.made}
    for numbers in seen.values():
        assert numbers[0] == numbers[1]  # a thread keeps its stream
    if max_batch_size == 1:  # predict in the request thread: one stream per request thread
        assert sorted(set(streams)) == [0, 1]


def test_without_a_placement_an_executor_computes_on_the_cpu() -> None:
    model = DeviceReport()
    model.device, model.loaded_on = "cpu", "cpu"
    handle = ModelHandle(DEVICE_REPORT, ModelSpec(model), load_config(arch="async"))
    assert isinstance(handle.placement.backend, CpuBackend)
    assert handle.placement.device == "cpu"


@pytest.mark.torch
def test_to_device_pins_and_copies_on_the_batch_stream_inside_a_batch() -> None:
    import torch

    fake = FakeCuda()
    placement = Placement("cuda:0", fake)
    ids = np.arange(6).reshape(2, 3)
    with placement.computing():
        where, stream, tensor = to_device(ids, "cuda:0")
        features = to_device({"input_ids": ids, "mask": torch.ones(2, 3), "modality": "text"}, "cuda:0")
    assert where == "on cuda:0" and stream is fake.made[0]
    assert isinstance(tensor, torch.Tensor) and tensor.tolist() == ids.tolist()
    assert len(fake.pinned) == 3  # the array, and both tensors of the mapping; the string is left as it is
    assert features["modality"] == "text" and features["input_ids"][0] == "on cuda:0"


@pytest.mark.torch
def test_to_device_is_a_plain_tensor_on_the_cpu_inside_a_batch_or_not() -> None:
    import torch

    ids = np.arange(3)
    outside = to_device(ids, "cpu")
    with Placement("cpu").computing():
        inside = to_device({"input_ids": ids, "modality": "text"}, "cpu")
    assert isinstance(outside, torch.Tensor) and outside.device.type == "cpu"
    assert torch.equal(inside["input_ids"], outside) and inside["modality"] == "text"


class FakeTensor:
    def __init__(self, where: str = "cpu", pinned: bool = False) -> None:
        self.device = SimpleNamespace(type=where)
        self.pinned = pinned
        self.copied: tuple[Any, bool] | None = None

    def is_pinned(self) -> bool:
        return self.pinned

    def pin_memory(self) -> FakeTensor:
        return FakeTensor(pinned=True)

    def to(self, device: Any, non_blocking: bool = False) -> FakeTensor:
        moved = FakeTensor(where="cuda")
        moved.copied = (device, non_blocking)
        return moved


def test_the_cuda_backend_asks_torch_for_streams_pinned_memory_and_non_blocking_copies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The one part that needs CUDA to run, checked against a stand-in for torch: what it calls, with what."""
    calls: list[tuple[str, Any]] = []
    stream = SimpleNamespace(synchronize=lambda: calls.append(("stream.synchronize", None)))

    def make_stream(device: Any) -> Any:
        calls.append(("Stream", device))
        return stream

    def use(s: Any) -> contextlib.AbstractContextManager[None]:
        calls.append(("use", s))
        return contextlib.nullcontext()

    torch = SimpleNamespace(
        device=lambda name: f"device({name})",
        cuda=SimpleNamespace(
            Stream=make_stream, stream=use, synchronize=lambda device: calls.append(("synchronize", device))
        ),
    )
    monkeypatch.setattr(device_module, "import_extra", lambda *args: torch)
    backend = CudaBackend("cuda:1")
    assert backend.stream() is stream and calls == [("Stream", "device(cuda:1)")]
    with backend.use(stream):
        pass
    assert calls[-1] == ("use", stream)
    host = FakeTensor()
    pinned = backend.pin(host)
    assert pinned.pinned and backend.pin(pinned) is pinned  # pinned once
    on_gpu = FakeTensor(where="cuda")
    assert backend.pin(on_gpu) is on_gpu  # already on a device: nothing to pin
    assert backend.move(pinned).copied == ("device(cuda:1)", True)
    backend.synchronize(stream)
    backend.synchronize()
    assert calls[-2:] == [("stream.synchronize", None), ("synchronize", "device(cuda:1)")]
