"""What a server's own parts share with the app built in the same process: `Served`.

A server makes one from the Config it serves and hands it to its app factory and to its parts: uvicorn's protocol
(servers/asgi/protocol.py counts what its parser refuses on the service) and twinserve's gunicorn worker (the
refusal before the app, the gRPC server its exit drains). Building the app fills it in. uvicorn pickles its Config,
with the app factory and the protocol factory, into each worker process in one pickle, so each worker's protocol
reads what that worker's app filled in; gunicorn's workers get a forked copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from twinserve.config import Config
from twinserve.fronts.early import EarlyRefusal
from twinserve.service.contract import Service

if TYPE_CHECKING:  # imported only with --grpc-port: its stubs fill protobuf's global pool
    from twinserve.fronts.grpc import GrpcThread

__all__ = ["Served"]


@dataclass(eq=False)
class Served:
    """One serving process's Config, and what the server needs of the service built from it (see the module)."""

    config: Config
    #: The service built in this process; None until the app is built.
    service: Service | None = None
    #: The refusal before the app, over `service` (asked only where it is `active`); None until the app is built.
    early: EarlyRefusal | None = None
    #: The sync architecture's gRPC server (`--grpc-port`), once its models have loaded; drained at the worker's exit.
    grpc: GrpcThread | None = None

    def serve(self, service: Service) -> None:
        """Record the service built in this process, and the refusal before the app that goes with it."""
        self.service = service
        self.early = EarlyRefusal(service)
