"""What a server hands to what it builds in one of its processes, and gets back from it: `Served`.

A server creates one with the Config it serves and hands it to the app it builds, and to its own parts that need the
service (twinserve's HTTP protocol under uvicorn, its worker under gunicorn). Building the app fills in what those
parts need of the service built from the Config: the service itself (its admission), the refusal made from a
request's head before the app (fronts/early.py) and, under gunicorn, the gRPC server that the worker's exit drains.
Nothing of this goes through the environment, a module global or the ASGI lifespan state.

One object per serving process. uvicorn (servers/asgi/server.py) holds it in its app factory and in its protocol
factory (`http=`); with several workers it pickles its Config into each spawned process, and one pickle keeps a
shared object shared, so in each worker the app it builds fills the `Served` its protocol reads. gunicorn
(servers/sync/server.py) holds it in its application, which each worker gets a copy of when it is forked.
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
