"""twinserve: serve one model in the sync and the async architecture, measure both, and choose."""

__version__ = "0.1.0"

from twinserve.config import Config, load_config
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
]


def serve(config: Config) -> None:
    """Serve `config.models` in `config.arch` (blocks until the server stops)."""
    from twinserve.servers import serve as _serve

    _serve(config)
