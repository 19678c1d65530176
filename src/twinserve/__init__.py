"""twinserve: serve one model in the sync and the async architecture, measure both, and choose.

The public names below are imported on first use (PEP 562), so that `twinserve --help` and the light commands
do not pay for pydantic-settings, numpy or the servers: `import twinserve` alone imports nothing heavy.
"""

import importlib as _importlib
import typing as _typing

__version__ = "0.1.0"

if _typing.TYPE_CHECKING:
    from twinserve.config import Config, load_config
    from twinserve.core.device import to_device
    from twinserve.errors import (
        ClientError,
        ModelFailed,
        ModelFileError,
        ModelNotFound,
        ServerError,
        TwinserveError,
        UntrustedModelFile,
        ValidationFailed,
    )
    from twinserve.loading import load_onnx, load_pickle, load_sklearn, load_torch_weights
    from twinserve.model import Model, Tensor, import_model
    from twinserve.observability.context import request_id, request_ids

__all__ = [
    "ClientError",
    "Config",
    "Model",
    "ModelFailed",
    "ModelFileError",
    "ModelNotFound",
    "ServerError",
    "Tensor",
    "TwinserveError",
    "UntrustedModelFile",
    "ValidationFailed",
    "__version__",
    "import_model",
    "load_config",
    "load_onnx",
    "load_pickle",
    "load_sklearn",
    "load_torch_weights",
    "request_id",
    "request_ids",
    "serve",
    "to_device",
]

#: Each lazily exported name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("Config", "load_config"), "twinserve.config"),
    **dict.fromkeys(
        (
            "ClientError",
            "ModelFailed",
            "ModelFileError",
            "ModelNotFound",
            "ServerError",
            "TwinserveError",
            "UntrustedModelFile",
            "ValidationFailed",
        ),
        "twinserve.errors",
    ),
    **dict.fromkeys(("load_onnx", "load_pickle", "load_sklearn", "load_torch_weights"), "twinserve.loading"),
    **dict.fromkeys(("Model", "Tensor", "import_model"), "twinserve.model"),
    **dict.fromkeys(("request_id", "request_ids"), "twinserve.observability.context"),
    "to_device": "twinserve.core.device",
}


if not _typing.TYPE_CHECKING:  # type checkers see the imports above; a module __getattr__ would hide typos

    def __getattr__(name: str) -> object:
        module = _EXPORTS.get(name)
        if module is None:
            raise AttributeError(f"module 'twinserve' has no attribute {name!r}")
        value = getattr(_importlib.import_module(module), name)
        globals()[name] = value  # once imported, an ordinary attribute
        return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def serve(config: "Config") -> None:
    """Serve `config.models` in `config.arch` (blocks until the server stops)."""
    from twinserve.servers import serve as _serve

    _serve(config)
