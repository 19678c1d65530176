"""`twinserve ray`: the same model and HTTP contract on Ray Serve, one async front per replica.

Each replica is a Ray Serve ASGI ingress running the app of `twinserve serve --arch async`, loading its models
once in its lifespan. Batching is twinserve's own batcher, not `@serve.batch`, which would bypass its admission,
deadlines and batch metrics. A model repository is read from each replica's node (`explicit` model control is
refused beside several replicas); gRPC is twinserve's own server per replica, since Ray's proxy routes only to
Ray-defined servicers. `max_ongoing_requests` is set above a replica's batcher capacity, so twinserve's own
admission answers 503. `/metrics` is per replica: summing over replicas is Prometheus's job.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from twinserve.cli_args import add_config_flags, positive
from twinserve.config import Config, load_config
from twinserve.core.settings import model_config
from twinserve.errors import ConfigError
from twinserve.extras import require
from twinserve.repository.layout import read_repository

if TYPE_CHECKING:
    from ray.serve import Application
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["APP_NAME", "Scaling", "TwinserveReplica", "add_ray", "build_app", "replica_capacity", "run"]

logger = logging.getLogger("twinserve.ray")

#: The Serve application and deployment name.
APP_NAME = "twinserve"
MiB = 1024 * 1024
#: A local Ray's shared-memory object store: requests and responses travel over HTTP, not through it.
LOCAL_OBJECT_STORE_BYTES = 100 * MiB
#: A replica whose models fail to load is retried this often before `twinserve ray` gives up (Ray's default: 20).
CONSTRUCTOR_RETRIES = 2
_REQUEST_ID = b"x-request-id"


@dataclass(frozen=True)
class Scaling:
    """A fixed number of replicas, or autoscaling between `min_replicas` and `max_replicas`."""

    replicas: int = 1
    autoscale: tuple[int, int] | None = None
    #: Autoscaling target per replica; None: the model's batch size (a replica's batcher is full at that many).
    target_ongoing: float | None = None
    #: CPUs Ray reserves for each replica.
    replica_cpus: float = 1.0
    #: Requests Ray's proxy may hold while no replica can take one (None: Ray's default, no bound).
    max_queued_requests: int | None = None

    def options(self, config: Config) -> dict[str, Any]:
        options: dict[str, Any] = {
            "max_ongoing_requests": replica_capacity(config),
            "ray_actor_options": {"num_cpus": self.replica_cpus},
            "max_constructor_retry_count": CONSTRUCTOR_RETRIES,
            "graceful_shutdown_timeout_s": config.graceful_timeout,
            # twinserve logs each request once, with its id, batch size and queue wait.
            "logging_config": {"enable_access_log": False},
        }
        if self.max_queued_requests is not None:
            # Ray answers these itself (plain text): the status and Retry-After at least match twinserve's 503.
            options["max_queued_requests"] = self.max_queued_requests
            options["backpressure_config"] = {"status_code": 503, "retry_after_s": 1}
        if self.autoscale is None:
            options["num_replicas"] = self.replicas
            return options
        low, high = self.autoscale
        target = self.target_ongoing if self.target_ongoing is not None else config.effective_max_batch_size
        options["autoscaling_config"] = {
            "min_replicas": low,
            "max_replicas": high,
            "initial_replicas": low,
            "target_ongoing_requests": target,
        }
        return options


def replica_capacity(config: Config) -> int:
    """Ray's `max_ongoing_requests`: more requests than a replica can hold before its own admission rejects.

    A replica's batcher holds at most `--max-queue` queued instances (so as many requests) per model plus
    `--model-workers` batches of at most `--max-batch-size` requests being computed; as many again may be decoding
    or encoding. Ray's default (5) would cap batches, and any cap at or under the batcher's would make Ray's proxy
    queue the excess (unbounded, or answered by Ray in plain text) where twinserve answers 503 + Retry-After with
    its own body: above it, a full replica still gets the request and rejects it like `twinserve serve` does.
    """
    if config.model_repository is None:
        return len(config.models) * _batcher_capacity(config)
    # Every version of a repository model has a batcher of its own, sized by the model's own settings.
    capacity = 0
    for folder in read_repository(config.model_repository):
        try:
            own = model_config(config, folder.settings, folder.name)
        except ConfigError:
            continue  # that model will be unavailable: it holds nothing
        capacity += len(folder.versions) * _batcher_capacity(own)
    return max(capacity, 1)


def _batcher_capacity(config: Config) -> int:
    in_flight = config.model_workers * config.effective_max_batch_size
    return config.max_queue + 2 * in_flight


class _ReplicaApp:
    """The async front as a replica serves it.

    Ray's proxy gives every request an `x-request-id` (the client's, else its own) and puts it on the response
    itself; the app echoes the same id, so its copy of the header is dropped rather than sent twice. Ray stops a
    replica without running its exit hooks, so its metrics directory goes when the app's lifespan ends.
    """

    def __init__(self, app: ASGIApp, metrics_dir: str | None) -> None:
        self.app = app
        self.metrics_dir = metrics_dir

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, self._removing_metrics(send))
        elif scope["type"] == "http" and any(name == _REQUEST_ID for name, _ in scope.get("headers", ())):
            await self.app(scope, receive, _without_request_id(send))
        else:
            await self.app(scope, receive, send)

    def _removing_metrics(self, send: Send) -> Send:
        async def send_and_clean(message: Message) -> None:
            if message["type"] == "lifespan.shutdown.complete" and self.metrics_dir is not None:
                shutil.rmtree(self.metrics_dir, ignore_errors=True)
            await send(message)

        return send_and_clean


def _without_request_id(send: Send) -> Send:
    async def send_once(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [(k, v) for k, v in message.get("headers", ()) if k.lower() != _REQUEST_ID]
        await send(message)

    return send_once


def _own_metrics_dir() -> str | None:
    """Give this replica process its own prometheus-client multiprocess directory (returned).

    It must be set before prometheus-client is first imported here; if something in the replica process imported
    it already, metrics stay in this process's default registry, which is also exact for this replica.
    """
    from twinserve.observability.metrics import MULTIPROC_ENV, prepare_multiprocess_dir

    os.environ.pop(MULTIPROC_ENV, None)  # never one inherited from the deploying process: that is another server's
    if "prometheus_client" in sys.modules:
        return None
    return prepare_multiprocess_dir()


class TwinserveReplica:
    """One Ray Serve replica: the async front over this process's `Service` (wrapped by `serve.ingress()`)."""

    def __init__(self, config_json: str, search_path: str) -> None:
        self._config_json = config_json
        # Like the CLI: `pkg.mod:Class` import strings resolve against the directory `twinserve ray` ran in.
        if search_path not in sys.path:
            sys.path.insert(0, search_path)

    def __serve_build_asgi_app__(self) -> ASGIApp:
        """Called by Ray once per replica; Ray then runs the app's lifespan, which loads the models."""
        metrics_dir = _own_metrics_dir()
        from twinserve.core.heap import settle
        from twinserve.fronts.asgi import create_asgi_app
        from twinserve.observability.logging import configure_logging
        from twinserve.observability.metrics import start_memory_sampler
        from twinserve.observability.tracing import setup_tracing
        from twinserve.repository import ModelRegistry
        from twinserve.service.contract import Service

        config = Config.model_validate_json(self._config_json)
        configure_logging(config.log_level, config.log_format)
        start_memory_sampler("server")
        # The registry `twinserve serve` builds: MODEL arguments, or every model and version of a repository.
        service = Service(ModelRegistry.from_config(config), config, setup_tracing(config))
        # A replica serves from its start to its end, in a process of its own: its heap settles as a server's does.
        return _ReplicaApp(create_asgi_app(service, on_ready=settle), metrics_dir)


def _replica_config(models: Sequence[str], config: Config) -> Config:
    if config.arch == "sync":
        raise ConfigError("--arch: Ray replicas run the async front; use async or hybrid")
    if config.workers not in (None, 1):
        raise ConfigError("--workers: each Ray replica is one server process; use --replicas or --autoscale")
    if config.model_repository is not None:
        if models:
            raise ConfigError("MODEL arguments and --model-repository are exclusive: serve one or the other")
        # Replicas run in Ray's worker processes, whose working directory is not this one. (`models` keeps
        # Config's default, which a repository stands in for.)
        return config.model_copy(update={"model_repository": config.model_repository.resolve()})
    if not models:
        raise ConfigError("MODEL: give at least one model to serve, or --model-repository")
    return config.model_copy(update={"models": list(models)})


def build_app(model: str | Sequence[str], config: Config, scaling: Scaling | None = None) -> Application:
    """The Ray Serve application serving `model` (or several, like `twinserve serve`) with `config`'s settings,
    for `serve.run` (async or hybrid)."""
    from twinserve.model import import_model
    from twinserve.observability.tracing import check_tracing

    require("ray", "twinserve ray", "ray.serve", needs="Ray Serve")
    config = _replica_config([model] if isinstance(model, str) else model, config)
    check_tracing(config)
    for target in config.models if config.model_repository is None else []:
        import_model(target)  # a bad MODEL fails here, not in every replica (a repository's are its own)
    scaling = scaling or Scaling()
    if config.model_control == "explicit" and (scaling.autoscale is not None or scaling.replicas > 1):
        raise ConfigError(
            "--model-control explicit: a load or unload would reach one replica only; use --replicas 1, or "
            "--model-control poll (every replica follows the folder)"
        )
    if config.api_keys:
        logger.warning(
            "API keys given inline travel in the Ray deployment's arguments (visible to the Ray cluster): "
            "prefer --api-key-file with the file present on every node"
        )
    from ray import serve

    deployment = serve.deployment(name=APP_NAME, **scaling.options(config))(serve.ingress()(TwinserveReplica))
    return deployment.bind(config.model_dump_json(), os.getcwd())


def _connect(address: str | None, num_cpus: int | None) -> None:
    import ray

    if address:
        try:
            ray.init(address=address)
        except ConnectionError as exc:
            raise ConfigError(f"--address: {exc}") from None
    else:
        ray.init(num_cpus=num_cpus, object_store_memory=LOCAL_OBJECT_STORE_BYTES, include_dashboard=False)


def run(
    model: str | Sequence[str],
    config: Config,
    scaling: Scaling,
    address: str | None = None,
    num_cpus: int | None = None,
) -> None:
    """Deploy `model` (or several) on Ray Serve (a local Ray unless `address` names a cluster) until SIGTERM/SIGINT.

    Stopping shuts Serve and the local Ray down; on a cluster it deletes this application only.
    """
    app = build_app(model, config, scaling)  # bad settings fail before Ray starts
    import ray
    from ray import serve

    stop = threading.Event()
    _connect(address, num_cpus)
    # After ray.init, so these handlers are the ones in place.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, frame: stop.set())
    try:
        serve.start(http_options={"host": config.host, "port": config.port})
        serve.run(app, name=APP_NAME, route_prefix="/")
        served = model if isinstance(model, str) else " ".join(model)
        if config.model_repository is not None:
            served = f"the models of {config.model_repository}"
        print(f"twinserve: serving {served} on Ray Serve at http://{config.host}:{config.port}", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        if address:
            serve.delete(APP_NAME)
        else:
            serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()


# -- the `twinserve ray` command -----------------------------------------------------------------------------
#: `twinserve ray`'s own arguments; every other one is a Config field.
_OWN_ARGS = frozenset(
    {
        "command",
        "handler",
        "models",
        "replicas",
        "autoscale",
        "target_ongoing",
        "max_queued_requests",
        "address",
        "num_cpus",
        "replica_cpus",
    }
)


def _bounds(text: str) -> tuple[int, int]:
    try:
        low, high = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX, got {text!r}") from None
    if not 0 <= low <= high or high < 1:
        raise argparse.ArgumentTypeError(f"expected 0 <= MIN <= MAX and MAX >= 1, got {text!r}")
    return low, high


def add_ray(parser: argparse.ArgumentParser) -> None:
    """The arguments of `twinserve ray`: its own, and every serve setting's flag."""
    parser.description = (
        "Deploy MODEL(s), or every model of --model-repository DIR, as a Ray Serve application (a local Ray "
        "unless --address) whose replicas each run twinserve's async front; Ray's proxy listens on --host:--port. "
        "Runs until SIGTERM/SIGINT."
    )
    parser.add_argument(
        "models",
        nargs="*",
        metavar="MODEL",
        help="import string `pkg.mod:Class` or `path/file.py:Class` (or --model-repository DIR instead)",
    )
    scaling = parser.add_mutually_exclusive_group()
    scaling.add_argument("--replicas", type=positive(int), default=1, help="fixed number of replicas (default 1)")
    scaling.add_argument("--autoscale", type=_bounds, metavar="MIN,MAX", help="autoscale between MIN and MAX")
    parser.add_argument(
        "--target-ongoing", type=positive(float), help="autoscaling target per replica (default: the batch size)"
    )
    parser.add_argument(
        "--max-queued-requests",
        type=positive(int),
        help="requests Ray's proxy may hold while no replica can take one, e.g. while replicas start (default: no "
        "bound); past it Ray itself answers 503 + Retry-After (plain text). A full replica answers twinserve's 503.",
    )
    parser.add_argument("--address", help="join this Ray cluster (default: start a local Ray)")
    parser.add_argument("--num-cpus", type=positive(int), help="CPUs of the local Ray (default: all)")
    parser.add_argument(
        "--replica-cpus", type=positive(float), default=1.0, help="CPUs reserved per replica (default 1)"
    )
    add_config_flags(parser)
    parser.set_defaults(handler=_ray_command)


def _ray_command(args: argparse.Namespace) -> int:
    overrides = {k: v for k, v in vars(args).items() if k not in _OWN_ARGS}
    overrides["arch"] = overrides.get("arch") or "async"
    if args.target_ongoing is not None and args.autoscale is None:
        print("twinserve: error: --target-ongoing needs --autoscale", file=sys.stderr)
        return 2
    scaling = Scaling(args.replicas, args.autoscale, args.target_ongoing, args.replica_cpus, args.max_queued_requests)
    try:
        run(args.models, load_config(**overrides), scaling, args.address, args.num_cpus)
    except ConfigError as exc:
        print(f"twinserve: error: {exc}", file=sys.stderr)
        return 2
    return 0
