"""Load model files without running code hidden in them.

Unpickling runs whatever the file says, and `joblib` files are pickles. These helpers load each kind of model
file with a format that cannot carry code (`load_sklearn` via skops with an explicit `trusted` list, `load_onnx`,
`load_torch_weights` via safetensors or `weights_only=True`), and `load_pickle` refuses unless `--trust-pickle`.
They fail with a twinserve error that says what to do otherwise. Call them from a model's `load()`; skops,
onnxruntime and safetensors come with the `safe` extra.
"""

from __future__ import annotations

import importlib
import importlib.abc
import logging
import pickle
import sys
import threading
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twinserve.errors import ModelFileError, UntrustedModelFile

if TYPE_CHECKING:
    from twinserve.config import Config

__all__ = ["load_onnx", "load_pickle", "load_sklearn", "load_torch_weights"]

logger = logging.getLogger("twinserve.loading")

_EXTRA = "pip install 'twinserve[safe]'"


def _existing(path: str | Path) -> Path:
    file = Path(path)
    if not file.is_file():
        raise ModelFileError(f"no such model file: {file}")
    return file


def _import(module: str, what: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ModelFileError(f"{what} needs the {module.split('.')[0]} package: {_EXTRA}") from None


class _RefuseInThisThread(importlib.abc.MetaPathFinder):
    """Makes `import <name>` fail with ImportError in one thread, for as long as it sits on `sys.meta_path`."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names, self.thread = names, threading.get_ident()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname.partition(".")[0] in self.names and threading.get_ident() == self.thread:
            raise ImportError(f"{fullname} is not imported while skops.io loads (twinserve.load_sklearn)")


def _import_skops() -> Any:
    """`skops.io`, without importing torch when the model has not.

    skops.io lists scikit-learn's estimators at import (`sklearn.utils.all_estimators`), which walks every
    sklearn package, `sklearn.externals.array_api_compat.torch` among them, and that one imports torch when it is
    installed: seconds and much private memory in every process that loads a skops file, for nothing the model
    uses. The walk skips a package that raises ImportError, so torch is refused while
    skops.io imports, in this thread only (another thread may import torch meanwhile). A model that already
    imported torch keeps it: nothing is saved then.
    """
    if "skops.io" in sys.modules or "torch" in sys.modules:
        return _import("skops.io", "load_sklearn")
    refuse = _RefuseInThisThread(frozenset({"torch"}))
    sys.meta_path.insert(0, refuse)
    try:
        return _import("skops.io", "load_sklearn")
    finally:
        sys.meta_path.remove(refuse)


def load_sklearn(path: str | Path, trusted: Sequence[str] = ()) -> Any:
    """A scikit-learn model (or any object) saved with `skops.io.dump`, rebuilding only trusted types.

    skops trusts scikit-learn's estimators, numpy and builtins by default; `trusted` adds types you have
    reviewed, by full name (`"sklearn.tree._tree.Tree"` for tree ensembles, say). Raises UntrustedModelFile
    naming every other type the file holds, and ModelFileError for a missing or non-skops file.
    """
    file = _existing(path)
    sio = _import_skops()
    try:
        return sio.load(file, trusted=list(trusted))
    except sio.exceptions.UntrustedTypesFoundException:
        untrusted = sorted(set(sio.get_untrusted_types(file=file)) - set(trusted))
        raise UntrustedModelFile(
            f"{file} holds types that are not trusted: {untrusted}. Review them, then list the ones you trust "
            f"in trusted=[...] (trusted now: {sorted(trusted)})",
            details={"untrusted_types": untrusted},
        ) from None
    except zipfile.BadZipFile:
        raise ModelFileError(
            f"{file} is not a skops file (save it with skops.io.dump; a pickle or joblib file needs "
            "twinserve.load_pickle and --trust-pickle)"
        ) from None


def load_onnx(path: str | Path, providers: Sequence[str] = ("CPUExecutionProvider",)) -> Any:
    """An onnxruntime `InferenceSession` for the ONNX model at `path` (the CPU provider unless told otherwise)."""
    file = _existing(path)
    ort = _import("onnxruntime", "load_onnx")
    try:
        return ort.InferenceSession(str(file), providers=list(providers))
    except Exception as exc:  # onnxruntime raises its own pybind exception types for invalid graphs
        raise ModelFileError(f"{file} is not a valid ONNX model: {type(exc).__name__}: {exc}") from None


def load_torch_weights(path: str | Path, device: str = "cpu") -> dict[str, Any]:
    """A torch state dict (name -> tensor) for `module.load_state_dict`, loaded without unpickling code.

    `.safetensors` files are read by safetensors; anything else (`.pt`, `.pth`, `.bin`) by `torch.load` with
    `weights_only=True`, which refuses any object other than tensors and plain containers (UntrustedModelFile).
    """
    file = _existing(path)
    if file.suffix == ".safetensors":
        st = _import("safetensors.torch", "load_torch_weights")
        try:
            weights: dict[str, Any] = st.load_file(str(file), device=device)
        except Exception as exc:  # safetensors_rust.SafetensorError for a corrupt or foreign file
            raise ModelFileError(f"{file} is not a valid safetensors file: {exc}") from None
        return weights
    torch = _import("torch", "load_torch_weights")
    try:
        loaded = torch.load(file, map_location=device, weights_only=True)
    except pickle.UnpicklingError as exc:
        # torch's message opens with advice to turn weights_only off; keep only the line naming the culprit.
        lines = [line for line in str(exc).splitlines() if "GLOBAL" in line or "Unsupported" in line]
        reason = lines[0].strip() if lines else "it is not a plain state dict"
        raise UntrustedModelFile(
            f"{file} holds objects other than tensors, which torch.load(weights_only=True) refuses to rebuild "
            f"({reason}). Save the state dict with safetensors.torch.save_file instead"
        ) from None
    except Exception as exc:
        raise ModelFileError(f"{file} is not a torch weights file: {type(exc).__name__}: {exc}") from None
    if not isinstance(loaded, dict):
        raise ModelFileError(f"{file} holds a {type(loaded).__name__}, not a state dict (name -> tensor)")
    return loaded


def load_pickle(path: str | Path, config: Config) -> Any:
    """A pickle or joblib file, only if `config.trust_pickle` (`--trust-pickle`): loading it runs its code.

    Refused (UntrustedModelFile) before the file is opened otherwise; allowed, it logs a warning each time.
    A model passes its own `self.config`.
    """
    file = _existing(path)
    if not config.trust_pickle:
        raise UntrustedModelFile(
            f"{file} would be unpickled, which runs any code it contains. Save the model with skops, ONNX or "
            "safetensors and load it with twinserve.load_sklearn / load_onnx / load_torch_weights; or, if you "
            "made this file yourself, start the server with --trust-pickle"
        )
    logger.warning("loading pickle %s: it can run arbitrary code, and is trusted because of --trust-pickle", file)
    import joblib  # a scikit-learn dependency; it reads plain pickles too

    try:
        return joblib.load(file)
    except Exception as exc:
        raise ModelFileError(f"{file} could not be unpickled: {type(exc).__name__}: {exc}") from None
