"""The public model contract, and how twinserve reads a model class.

A model is any class with a batch-first `predict`; subclassing `Model` is optional and only adds defaults::

    class Iris(twinserve.Model):
        name = "iris"

        def load(self) -> None:                       # or `async def`; once per process
            self.clf = train()

        def predict(self, batch: list[Features]) -> list[Label]:   # or `async def`
            return [...]                              # exactly one output per input

Instance types come from the annotations (`preprocess`'s parameter, else `predict`'s batch element; none means
any JSON). Optional hooks: `preprocess(instance)`, `examples()`, and for V2 tensors `inputs` / `outputs` with
`from_tensors` / `to_tensors` (else derived, see `twinserve.protocol.tensors`); an `a`-prefixed twin of a hook is
the coroutine one, which the async front prefers. A `predict` that is a generator makes a streaming model: each
step yields one chunk per instance, sent as it is made on `:stream` and collected on `:predict`. A model whose
`predict` must not see an instance twice sets `isolate_failures = False` (see `twinserve.core.isolation`).
"""

from __future__ import annotations

import collections.abc
import contextlib
import functools
import importlib
import importlib.util
import inspect
import sys
import types
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from twinserve.errors import ConfigError, ModelImportError, OutputMismatch

if TYPE_CHECKING:
    import numpy as np

    from twinserve.config import Config

__all__ = ["DATATYPES", "Hook", "Model", "ModelSpec", "PredictResult", "Tensor", "check_step", "import_model"]

#: The tensor datatypes of the Open Inference Protocol (V2).
DATATYPES = frozenset(
    {"BOOL", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64", "FP16", "FP32", "FP64", "BYTES"}
)


@dataclass(frozen=True)
class Tensor:
    """One named tensor of the Open Inference Protocol (V2): a datatype and a shape, -1 for a variable dimension.

    The first dimension is the batch dimension (always -1): row i of every input is instance i, row i of every
    output is the output of instance i.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]

    def __init__(self, name: str, datatype: str, shape: Sequence[int] = (-1,)) -> None:
        shape = tuple(shape)
        if not name or not isinstance(name, str):
            raise ModelImportError(f"a tensor needs a name, got {name!r}")
        if datatype not in DATATYPES:
            raise ModelImportError(f"tensor {name!r}: datatype must be one of {sorted(DATATYPES)}, got {datatype!r}")
        if not shape or shape[0] != -1 or any(not isinstance(d, int) or d < -1 for d in shape):
            raise ModelImportError(f"tensor {name!r}: shape must start with the batch dimension -1, got {list(shape)}")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "datatype", datatype)
        object.__setattr__(self, "shape", shape)

    def describe(self) -> dict[str, Any]:
        """The V2 metadata of this tensor."""
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


class Model:
    """Optional base class for models; documents the contract, supplies defaults and types every hook.

    Only `predict` (or `apredict`) is required. The optional hooks below are declared for editors and type
    checkers alone: twinserve tells what a model does by which hooks its class defines, so at run time the base
    class defines none of them. Any hook may be a plain `def` or an `async def`.
    """

    #: Served name; defaults to the class name in lower case.
    name: ClassVar[str | None] = None
    #: Reported by `GET /v1/models/{name}`.
    version: ClassVar[str] = "1"
    #: Set by twinserve before `load()` is called.
    config: Config
    #: Where to compute, set before `load()` too: `cpu`, `cuda` or `cuda:N` (`--device`, resolved).
    device: str
    #: The V2 input and output tensors; None: derived from the instance and output types.
    inputs: ClassVar[Sequence[Tensor] | None] = None
    outputs: ClassVar[Sequence[Tensor] | None] = None
    #: When predict raises for a batch of several requests, twinserve re-runs parts of it to find the failing
    #: requests (see `twinserve.core.isolation`); False when predict must never see an instance twice.
    isolate_failures: ClassVar[bool] = True
    #: Per-model settings over the server's flags (twinserve.core.settings: `max_batch_size`, `max_batch_delay_ms`,
    #: `executor`, `model_workers`, `max_queue`, `timeout_ms`, `cache_size`, `cache_ttl_s`, `default_priority`);
    #: a model repository's `twinserve.toml` `[settings]` table wins over them.
    settings: ClassVar[Mapping[str, Any] | None] = None
    #: The files `load()` reads, relative to the folder of the model's module (a folder ends with `/`): what
    #: `twinserve k8s --out` carries into the image beside the module. Not declared: every file beside the module.
    #: Written as a literal list in the class body, since k8s reads it from the source without importing the model.
    files: ClassVar[Sequence[str]] = ()

    def load(self) -> Awaitable[None] | None:
        """Load weights, open pools (`def` or `async def`). Called once per process, before the server reports
        ready; `self.config` is set by then."""
        return None

    def predict(self, batch: list[Any]) -> PredictResult:
        """Return one output per instance of `batch`, in order (`def` or `async def`); or, as a generator (or async
        generator), yield steps that hold one chunk per instance: a streaming model."""
        raise NotImplementedError

    def examples(self) -> Sequence[Any]:
        """A few valid instances, used as default payloads by the lab and shown in model metadata."""
        return []

    if TYPE_CHECKING:

        def preprocess(self, instance: Any) -> Any:
            """Turn one validated instance into what `predict` takes, e.g. fetch its features (I/O). Runs per
            instance, before batching; its parameter's annotation is the instance type clients send."""

        def apreprocess(self, instance: Any) -> Awaitable[Any]:
            """The coroutine twin of `preprocess`: the async front prefers it, the sync front the plain one."""

        def apredict(self, batch: list[Any]) -> Awaitable[Sequence[Any]] | AsyncIterator[Sequence[Any]]:
            """The coroutine (or async-generator) twin of `predict`: the async front prefers it."""

        def from_tensors(self, arrays: dict[str, np.ndarray[Any, Any]]) -> Sequence[Any]:
            """V2: the model's own conversion of its input tensors (by name, row i = instance i) to instances."""

        def to_tensors(self, outputs: list[Any]) -> Mapping[str, Any]:
            """V2: the model's own conversion of `predict`'s outputs to arrays, one per output tensor name."""


#: What `predict` may return: the outputs, or (a streaming model) the steps, each one chunk per instance.
PredictResult = Sequence[Any] | Iterator[Sequence[Any]] | Awaitable[Sequence[Any]] | AsyncIterator[Sequence[Any]]


@dataclass(frozen=True)
class Hook:
    """One bound model hook and whether calling it returns a coroutine (or, for a stream, an async generator)."""

    fn: Callable[..., Any]
    is_async: bool
    #: Whether it is a generator function (an async one when `is_async`): a streaming predict.
    streams: bool = False


def _hook(obj: object, name: str) -> Hook | None:
    fn = getattr(obj, name, None)
    if fn is None or not callable(fn) or getattr(fn, "__func__", None) is Model.predict:
        return None  # Model's own predict only documents the contract: a model with just apredict has no predict
    if inspect.isasyncgenfunction(fn):
        return Hook(fn, is_async=True, streams=True)
    return Hook(fn, inspect.iscoroutinefunction(fn), streams=inspect.isgeneratorfunction(fn))


def check_step(step: Any, expected: int) -> list[Any]:
    """One step of a streaming predict as a list of `expected` chunks, or OutputMismatch (500)."""
    if not isinstance(step, list | tuple):
        kind = type(step).__name__
        raise OutputMismatch(f"a streaming predict must yield lists (one chunk per instance), got {kind}")
    if len(step) != expected:
        raise OutputMismatch(f"a streaming predict yielded {len(step)} chunks for {expected} inputs")
    return list(step)


def _collecting(stream: Hook) -> Hook:
    """`predict` for a streaming model called as a plain one: every step, gathered per instance."""
    gen = stream.fn
    if stream.is_async:

        async def acollect(batch: list[Any]) -> list[list[Any]]:
            outputs: list[list[Any]] = [[] for _ in batch]
            async for step in gen(batch):
                for output, chunk in zip(outputs, check_step(step, len(batch)), strict=True):
                    output.append(chunk)
            return outputs

        return Hook(functools.wraps(gen)(acollect), is_async=True)

    def collect(batch: list[Any]) -> list[list[Any]]:
        outputs: list[list[Any]] = [[] for _ in batch]
        for step in gen(batch):
            for output, chunk in zip(outputs, check_step(step, len(batch)), strict=True):
                output.append(chunk)
        return outputs

    return Hook(functools.wraps(gen)(collect), is_async=False)


_ITERATORS = {
    collections.abc.Iterator, collections.abc.Iterable, collections.abc.Generator,
    collections.abc.AsyncIterator, collections.abc.AsyncIterable, collections.abc.AsyncGenerator,
}  # fmt: skip


def _yielded(annotation: Any) -> Any:
    """`Iterator[X]` / `AsyncGenerator[X, None]`... -> X; anything else -> Any."""
    if typing.get_origin(annotation) in _ITERATORS:
        args = typing.get_args(annotation)
        if args:
            return args[0]
    return Any


def _element_type(annotation: Any) -> Any:
    """`list[X]` / `Sequence[X]` -> X; anything else -> Any."""
    origin = typing.get_origin(annotation)
    if origin is not None and isinstance(origin, type) and issubclass(origin, Sequence):
        args = typing.get_args(annotation)
        if args:
            return args[0]
    return Any


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except Exception:  # unresolvable forward references: treat as unannotated
        return {}


def _first_param_hint(fn: Callable[..., Any]) -> Any:
    params = [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]
    if not params:
        return Any
    return _hints(fn).get(params[0].name, Any)


class ModelSpec:
    """What twinserve knows about one model instance: its name, hooks and instance types."""

    def __init__(self, model: object) -> None:
        cls = type(model)
        self.model = model
        self.name: str = getattr(model, "name", None) or cls.__name__.lower()
        self.version: str = str(getattr(model, "version", "1"))
        self.isolate_failures = bool(getattr(model, "isolate_failures", True))
        predict = _hook(model, "predict")
        apredict = _hook(model, "apredict")
        if predict is None and apredict is None:
            raise ModelImportError(f"{cls.__qualname__} has no predict(batch) method")
        self.load = _hook(model, "load")
        # Sync callers prefer the blocking hook, async callers the coroutine one; each falls back to the other.
        self.predict: Hook = predict or apredict  # type: ignore[assignment]
        self.apredict: Hook = apredict or predict  # type: ignore[assignment]
        preprocess = _hook(model, "preprocess")
        apreprocess = _hook(model, "apreprocess")
        self.preprocess = preprocess or apreprocess
        self.apreprocess = apreprocess or preprocess

        predict_fn = self.predict.fn
        self.streams: bool = self.predict.streams
        if self.apredict.streams != self.streams:
            raise ModelImportError(f"{cls.__qualname__}: predict and apredict must both be generators, or neither")
        #: The generator hooks of a streaming model (same preferences as predict/apredict); None otherwise.
        self.stream: Hook | None = None
        self.astream: Hook | None = None
        if self.streams:
            self.stream, self.astream = self.predict, self.apredict
            # Called as a plain predict (`:predict`, V2 infer, batching), a stream answers with all its chunks.
            self.predict, self.apredict = _collecting(self.predict), _collecting(self.apredict)
            #: What one step holds per instance; an instance's whole prediction is the list of its chunks.
            self.chunk_type: Any = _element_type(_yielded(_hints(predict_fn).get("return", Any)))
            self.output_type: Any = types.GenericAlias(list, (self.chunk_type,))
        else:
            self.output_type = _element_type(_hints(predict_fn).get("return", Any))
        if self.preprocess is not None:
            self.input_type: Any = _first_param_hint(self.preprocess.fn)
        else:
            self.input_type = _element_type(_first_param_hint(predict_fn))
        # The Open Inference Protocol (V2) view: declared tensors and conversion hooks, each optional.
        self.inputs = _tensors(model, "inputs")
        self.outputs = _tensors(model, "outputs")
        self.from_tensors = _converter(model, "from_tensors")
        self.to_tensors = _converter(model, "to_tensors")

    def examples(self) -> list[Any]:
        fn = getattr(self.model, "examples", None)
        return list(fn()) if callable(fn) else []


def _tensors(model: object, attribute: str) -> tuple[Tensor, ...] | None:
    declared = getattr(model, attribute, None)
    if declared is None:
        return None
    tensors = tuple(declared)
    if not tensors or not all(isinstance(t, Tensor) for t in tensors):
        raise ModelImportError(f"{type(model).__qualname__}.{attribute} must be a non-empty list of twinserve.Tensor")
    if len({t.name for t in tensors}) != len(tensors):
        raise ModelImportError(f"{type(model).__qualname__}.{attribute} names a tensor twice")
    return tensors


def _converter(model: object, name: str) -> Callable[..., Any] | None:
    hook = _hook(model, name)
    if hook is not None and hook.is_async:
        raise ModelImportError(f"{type(model).__qualname__}.{name} must be a plain def: it only converts data")
    return None if hook is None else hook.fn


def _import_from_file(path: Path, module_name: str | None = None) -> Any:
    """Import the file `path` as a module, under `module_name` (default: from the file's name). A named import (a
    model repository's, where every version has its own `model.py`, and each load of it a name of its own) has the
    file's folder on `sys.path` for the import alone, so that the files beside it import as they would from that
    folder."""
    named = module_name is not None
    module_name = module_name or "twinserve_user_" + path.stem
    existing = sys.modules.get(module_name)
    if existing is not None and getattr(existing, "__file__", None) == str(path):
        # Two models from one file share its classes: instances pickled to model workers must resolve by name.
        return existing
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ModelImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    folder = str(path.parent)
    if named:
        sys.path.insert(0, folder)
    try:
        if named:
            # From the source itself, never a cached .pyc: a file rewritten within one second at the same size
            # (a repository reload) would pass the .pyc's mtime-and-size check and run the old code.
            exec(compile(path.read_bytes(), str(path), "exec"), module.__dict__)
        else:
            spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)  # a fixed file is imported afresh on the next load
        raise
    finally:
        if named:
            with contextlib.suppress(ValueError):
                sys.path.remove(folder)
    return module


_HOW = "MODEL is written 'pkg.module:Class' (importable from this folder) or 'path/to/file.py:Class'"


def _models_in(module: types.ModuleType) -> list[str]:
    """The names of the model classes `module` defines itself, for an error that says what MODEL could be."""
    return sorted(
        name
        for name, obj in vars(module).items()
        if isinstance(obj, type)
        and obj.__module__ == module.__name__
        and (callable(getattr(obj, "predict", None)) or callable(getattr(obj, "apredict", None)))
    )


def import_model(target: str, module: str | None = None) -> type:
    """Resolve `package.module:Class` or `path/to/file.py:Class` to the model class (a file imported under the
    name `module` when given: see `_import_from_file`).

    Each way it can fail says which part of MODEL is wrong (ModelImportError, one line).
    """
    module_part, sep, attr = target.rpartition(":")
    if not sep or not module_part or not attr:
        raise ModelImportError(f"MODEL must look like 'pkg.module:Class' or 'file.py:Class', got {target!r}")
    try:
        if module_part.endswith(".py"):
            path = Path(module_part).resolve()
            if not path.is_file():
                raise ModelImportError(f"no such file: {module_part} ({_HOW})")
            imported = _import_from_file(path, module)
        else:
            imported = importlib.import_module(module_part)
    except (ModelImportError, ConfigError):  # a missing extra names the pip command itself
        raise
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_part == exc.name or module_part.startswith(exc.name + ".")):
            raise ModelImportError(f"no module {module_part!r} ({_HOW})") from exc
        raise ModelImportError(f"cannot import {module_part!r}: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        raise ModelImportError(f"cannot import {module_part!r}: {type(exc).__name__}: {exc}") from exc
    obj: Any = imported
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            found = _models_in(imported)
            hint = f"it defines {', '.join(found)}" if found else "it defines no class with a predict() method"
            raise ModelImportError(f"no class {attr!r} in module {module_part!r} ({hint})")
    if not isinstance(obj, type):
        raise ModelImportError(f"{target!r} is a {type(obj).__name__}, not a class")
    if not callable(getattr(obj, "predict", None)) and not callable(getattr(obj, "apredict", None)):
        raise ModelImportError(f"{attr!r} has no predict(batch) method: a model is a class with a batch-first predict")
    return obj
