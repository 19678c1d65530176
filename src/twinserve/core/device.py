"""Where a model computes (`--device cpu | cuda | cuda:N | auto`), and the CUDA streams its batches run on.

- `resolve_device(setting)`: the device string a model sees as `self.device`; a device that cannot be had fails
  at start-up (`MissingExtra` without torch, `ConfigError` without the GPU).
- `Placement`: gives each thread that runs predict its own stream, so one batch's host-to-device copy overlaps
  another's compute; `CpuBackend` makes every step a pass-through, so the same code path runs on a CPU.
- `to_device(array, device)`: what a model calls to hand a batch to the device (pinned, non-blocking on CUDA).

torch is imported only when a CUDA device is asked for, so `core/` stays importable without the `torch` extra.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol

from twinserve.core.threads import cap_this_thread
from twinserve.errors import ConfigError, MissingExtra
from twinserve.extras import import_extra, installed

__all__ = [
    "DEVICE_PATTERN",
    "CpuBackend",
    "CudaBackend",
    "CudaProbe",
    "DeviceBackend",
    "Placement",
    "TorchProbe",
    "backend_for",
    "current_placement",
    "device_for",
    "resolve_device",
    "to_device",
]

logger = logging.getLogger("twinserve.device")

#: What `--device` accepts.
DEVICE_PATTERN = re.compile(r"cpu|auto|cuda(:\d+)?")


class CudaProbe(Protocol):
    """What `resolve_device` needs to know of this machine (faked in tests)."""

    def torch_installed(self) -> bool: ...
    def device_count(self) -> int: ...


class TorchProbe:
    """The real machine, asked through torch (imported on first use)."""

    def torch_installed(self) -> bool:
        return installed("torch")

    def device_count(self) -> int:
        torch = import_extra("torch", "torch", "--device cuda")
        # device_count (unlike is_available) asks NVML first, so this process can still fork workers (gunicorn)
        # that initialise CUDA themselves.
        count: int = torch.cuda.device_count()
        return count


def resolve_device(setting: str, probe: CudaProbe | None = None) -> str:
    """The device `setting` names on this machine: `cpu`, `cuda` or `cuda:N`; raises at start-up if it cannot be."""
    if not DEVICE_PATTERN.fullmatch(setting):
        raise ConfigError(f"--device: expected cpu, cuda, cuda:N or auto, got {setting!r}")
    if setting == "cpu":
        return setting  # no probe at all: the default never imports torch
    probe = probe or TorchProbe()
    if setting == "auto":
        return "cuda" if probe.torch_installed() and probe.device_count() > 0 else "cpu"
    if not probe.torch_installed():
        raise MissingExtra(f"--device {setting}", "torch")
    count = probe.device_count()
    index = int(setting.partition(":")[2] or 0)
    if count == 0:
        raise ConfigError(f"--device {setting}: torch sees no CUDA device here (use --device cpu or auto)")
    if index >= count:
        raise ConfigError(f"--device {setting}: only {count} CUDA device(s) visible (cuda:0..cuda:{count - 1})")
    return setting


@functools.cache
def device_for(setting: str) -> str:
    """`resolve_device(setting)` on this machine, once per process, and logged."""
    device = resolve_device(setting)
    # The default says nothing new; a device that was asked for (or found) is worth a line at start-up.
    level = logging.DEBUG if setting == "cpu" else logging.INFO
    logger.log(level, "models compute on %s (--device %s)", device, setting)
    return device


class DeviceBackend(Protocol):
    """Streams and host memory of one device: what `Placement` asks of torch, and what tests fake."""

    def stream(self) -> Any:
        """A new stream on the device."""

    def use(self, stream: Any) -> AbstractContextManager[Any]:
        """Make `stream` current in this thread for the block."""

    def pin(self, tensor: Any) -> Any:
        """`tensor` in page-locked host memory (so its copy to the device can run without blocking)."""

    def move(self, tensor: Any) -> Any:
        """`tensor` copied to the device, asynchronously on the current stream where it can be."""

    def synchronize(self, stream: Any | None = None) -> None:
        """Wait until `stream` (None: every stream of the device) has done its work."""


class CpuBackend:
    """Every step a pass-through: with `--device cpu` a batch runs the same code as on a GPU, at no cost."""

    def stream(self) -> None:
        return None

    def use(self, stream: Any) -> AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def pin(self, tensor: Any) -> Any:
        return tensor

    def move(self, tensor: Any) -> Any:
        return tensor

    def synchronize(self, stream: Any | None = None) -> None:
        pass


class CudaBackend:
    """torch's CUDA streams and pinned memory on one device."""

    def __init__(self, device: str) -> None:
        self._torch = import_extra("torch", "torch", f"--device {device}")
        self.device = self._torch.device(device)

    def stream(self) -> Any:
        return self._torch.cuda.Stream(self.device)

    def use(self, stream: Any) -> AbstractContextManager[Any]:
        return self._torch.cuda.stream(stream)  # type: ignore[no-any-return]

    def pin(self, tensor: Any) -> Any:
        if tensor.device.type != "cpu" or tensor.is_pinned():  # already on a device, or pinned
            return tensor
        return tensor.pin_memory()

    def move(self, tensor: Any) -> Any:
        # From pinned memory, non_blocking lets this copy overlap another stream's kernels.
        return tensor.to(self.device, non_blocking=True)

    def synchronize(self, stream: Any | None = None) -> None:
        if stream is None:
            self._torch.cuda.synchronize(self.device)
        else:
            stream.synchronize()


def backend_for(device: str) -> DeviceBackend:
    return CudaBackend(device) if device.startswith("cuda") else CpuBackend()


_current: contextvars.ContextVar[Placement | None] = contextvars.ContextVar("twinserve_placement", default=None)


def current_placement() -> Placement | None:
    """The placement of the batch this code computes, if any."""
    return _current.get()


class Placement:
    """One device, and one stream on it per thread that runs predict (a model worker thread, or a model-worker
    process's only thread), made on that thread's first batch and kept for every later one."""

    def __init__(self, device: str, backend: DeviceBackend | None = None) -> None:
        self.device = device
        self.backend = backend if backend is not None else backend_for(device)
        self._local = threading.local()

    def _stream(self) -> Any:
        try:
            return self._local.stream
        except AttributeError:
            self._local.stream = self.backend.stream()
            return self._local.stream

    @contextlib.contextmanager
    def computing(self) -> Iterator[None]:
        """Run the block (one batch's predict) on this thread's stream, with this thread's math threads capped as
        the process's are (core/threads.py); its work is done when the block ends."""
        cap_this_thread()
        stream = self._stream()
        token = _current.set(self)
        try:
            with self.backend.use(stream):
                yield
                # The outputs leave this thread next (the reply, or a pipe): nothing may still be in flight.
                self.backend.synchronize(stream)
        finally:
            _current.reset(token)

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """Only mark the block as this placement's (`to_device` pins and copies without blocking), on the thread's
        current stream: for a coroutine predict, which shares the event loop's thread with every other."""
        token = _current.set(self)
        try:
            yield
        finally:
            _current.reset(token)

    def loaded(self) -> None:
        """After `load()`: the weights' copies to the device are finished before any stream reads them."""
        self.backend.synchronize()

    def to_device(self, value: Any) -> Any:
        """`value` on this device: pinned, then copied without blocking on the current stream."""
        return _each_tensor(value, lambda tensor: self.backend.move(self.backend.pin(tensor)))


def to_device(value: Any, device: str) -> Any:
    """`value` (an array or a tensor, or a mapping whose arrays and tensors are moved and other values kept: a
    tokenizer's output) as torch tensors on `device`, the model's `self.device`.

    In a batch that twinserve runs on that device the host tensor is pinned and copied on the batch's own stream
    without blocking; anywhere else (in `load`, a stream's steps, a test) it is `torch.as_tensor(value).to(device)`."""
    placement = _current.get()
    if placement is not None and placement.device == device:
        return placement.to_device(value)
    return _each_tensor(value, lambda tensor: tensor.to(device))


def _each_tensor(value: Any, move: Callable[[Any], Any]) -> Any:
    torch = import_extra("torch", "torch", "twinserve.to_device")
    if not isinstance(value, Mapping):
        return move(torch.as_tensor(value))
    return {
        name: move(torch.as_tensor(item)) if isinstance(item, torch.Tensor) or hasattr(item, "__array__") else item
        for name, item in value.items()
    }
