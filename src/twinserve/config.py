"""The one configuration object.

Every setting is a field of `Config`. The CLI builds its flags from these fields (so `--help` can never drift
from what the server accepts) and `TWINSERVE_<FIELD>` environment variables fill whatever the command line
leaves unset; a settings file (`--config FILE.toml`, keys = field names) sits between the two. Cross-field rules
live in `Config` too, so invalid settings fail before any port is bound.
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from twinserve.api_keys import MIN_API_KEY_LENGTH, admin_key_from_file, check_file_mode, check_key, read_key_file
from twinserve.errors import ConfigError
from twinserve.setting_types import ApiKeyList, CommaList, DeviceName, HostList, ProxyList

__all__ = [
    "DEFAULT_MODEL",
    "MAX_REQUEST_LINE",
    "MIN_API_KEY_LENGTH",
    "Architecture",
    "Config",
    "ExecutorName",
    "load_config",
    "read_key_file",
]

Architecture = Literal["sync", "async", "hybrid"]
ExecutorName = Literal["auto", "inline", "thread", "process"]
DEFAULT_MODEL = "twinserve.examples.tabular:Classifier"

MiB = 1024 * 1024
#: gunicorn refuses request lines longer than this whatever it is told; both servers share the bound.
MAX_REQUEST_LINE = 8190
#: The settings file the Config being built reads (`load_config(config_file=...)`); a context variable because
#: pydantic-settings builds its sources in a classmethod, and concurrent loads must not see each other's file.
_SETTINGS_FILE: ContextVar[Path | None] = ContextVar("twinserve_settings_file", default=None)


class Config(BaseSettings):
    """Settings for one `twinserve serve` (CLI flag `--x-y` or env `TWINSERVE_X_Y` for field `x_y`)."""

    model_config = SettingsConfigDict(env_prefix="TWINSERVE_", extra="forbid", frozen=True)

    models: list[str] = Field(
        default_factory=lambda: [DEFAULT_MODEL],
        min_length=1,
        description="Model import strings, `pkg.mod:Class` or `path/file.py:Class`.",
    )
    arch: Architecture = Field(
        "sync", description="sync: Flask/gunicorn; async: ASGI/uvicorn; hybrid: async + a model-process pool."
    )
    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(8000, ge=0, le=65535, description="Port to bind (0: any free port).")
    grpc_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Also serve the Open Inference Protocol over gRPC on this port (0: any free port; off by default).",
    )
    workers: int | None = Field(
        None, ge=1, le=512, description="Server processes (default: CPU cores for sync, 1 for async)."
    )
    threads: int = Field(
        4,
        ge=1,
        le=1024,
        description="Sync: request threads per worker. Async: threads that run blocking model hooks.",
    )
    worker_class: Literal["gthread", "sync"] = Field(
        "gthread",
        description="--arch sync: `gthread`, --threads request threads per worker process; `sync`, one request at "
        "a time in the worker's main thread (twinserve's worker class on gunicorn's worker API, either way).",
    )
    executor: ExecutorName = Field(
        "auto",
        description="Where predict runs: inline (awaited on the loop), thread, or process "
        "(auto: process for hybrid, inline for an async predict, else thread).",
    )
    model_workers: int = Field(
        1, ge=1, le=256, description="Threads (thread executor) or processes (process executor) running predict."
    )
    model_threads: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Threads each math library (torch, BLAS, OpenMP) may use where predict runs (default: the "
        "usable cores shared among the predicts run at once, only ever lowering a library's own count; left alone "
        "when OMP_NUM_THREADS, MKL_NUM_THREADS or OPENBLAS_NUM_THREADS is set).",
    )
    device: DeviceName = Field(
        "cpu",
        description="Where models compute, as `self.device`: cpu, cuda, cuda:N, or auto (cuda when torch sees a GPU, "
        "else cpu); each model worker thread or process runs its batches on a CUDA stream of its own.",
    )
    max_batch_size: int | None = Field(
        None,
        ge=1,
        le=65536,
        description="Most instances per predict call (default: 1 for sync, i.e. predict in the request "
        "thread; 32 for async and hybrid).",
    )
    max_batch_delay_ms: float = Field(
        0.0,
        ge=0,
        le=60_000,
        description="How long the oldest request may wait for a batch to fill (0: go as soon as a model worker "
        "is free; batches still form while it is busy).",
    )
    max_queue: int = Field(
        1024,
        ge=1,
        description="Instances admitted at once to wait for a model worker; past it a request waits only as long "
        "as --max-queue-wait-ms allows, else 503 + Retry-After.",
    )
    max_queue_wait_ms: float = Field(
        1000.0,
        ge=0,
        le=60_000,
        description="Past --max-queue, a request is still queued while the measured wait ahead of it is under "
        "this (its level's share of it, as of the queue): a crowd of retrying clients waits instead of being "
        "refused and coming straight back. 0: refuse at once.",
    )
    priority_levels: int = Field(
        3,
        ge=1,
        le=10,
        description="Priority levels a request may ask for with X-Priority or V2 parameters.priority (1 is the "
        "highest); level p may fill (levels - p + 1) / levels of --max-queue, so the lowest is refused first.",
    )
    default_priority: int = Field(
        1, ge=1, description="The level of a request that names none (1: the whole queue is open to it)."
    )
    timeout_ms: int | None = Field(
        None, ge=1, description="Default deadline per request (504 past it; a queued request is not computed)."
    )
    max_timeout_ms: int = Field(
        60_000, ge=1, description="Cap on the deadline a client may ask for in the X-Request-Timeout-Ms header."
    )
    rate_limit: float | None = Field(
        None, gt=0, description="Requests per second the server admits in all (429 + Retry-After past it)."
    )
    rate_burst: int | None = Field(
        None, ge=1, description="Burst size of the rate limit (default: one second's worth)."
    )
    cache_size: int = Field(0, ge=0, description="Cached outputs per model, LRU (0: no cache).")
    cache_ttl_s: float | None = Field(None, gt=0, description="Seconds a cached output stays valid (default: forever).")
    isolate_failures: bool = Field(
        True,
        description="When predict raises for a batch of several requests, re-run it split in halves so that only "
        "the requests that fail alone get the error (a model opts out with `isolate_failures = False`).",
    )
    isolate_max_reruns: int = Field(
        32, ge=1, le=65536, description="Most predict re-runs spent isolating the failing requests of one batch."
    )
    trust_pickle: bool = Field(
        False,
        description="Let models load pickle/joblib files with twinserve.load_pickle (unpickling runs any code "
        "in the file; prefer skops, ONNX or safetensors).",
    )
    debug: bool = Field(False, description="Serve every request in one foreground thread so breakpoint()/pdb work.")
    expose_errors: bool = Field(
        False,
        description="Answer a model's exception text to the client whose request alone raised it (off: clients get "
        "the error code, the model and the request id; the log has the text). On with --debug.",
    )
    max_body_bytes: int = Field(16 * MiB, ge=1, description="Largest request body accepted (else 413).")
    ws_max_pending: int = Field(
        64,
        ge=1,
        le=65536,
        description="Most unanswered messages per WebSocket; past it a message is answered at once with a "
        "too_many_pending error (async and hybrid).",
    )
    ws_max_per_client: int = Field(
        32,
        ge=1,
        le=65536,
        description="Most open WebSockets per client address in each server process; past it a handshake is "
        "refused with 429 (async and hybrid).",
    )
    ws_max_message_bytes: int | None = Field(
        None, ge=1, description="Largest WebSocket message accepted, else close 1009 (default: --max-body-bytes)."
    )
    graceful_timeout: float = Field(30.0, ge=0, description="Seconds in-flight requests get to finish after SIGTERM.")
    read_timeout_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="Seconds a client may take to send a request's head, and again its body, each in total however "
        "steadily it trickles (a slow body gets 408; a slow head, a closed connection); and, for a stream (SSE or "
        "WebSocket), the longest it may read nothing while an event waits to be written (then it is closed).",
    )
    log_level: Literal["debug", "info", "warning", "error", "critical"] = Field("info", description="Log level.")
    log_format: Literal["auto", "json", "console"] = Field(
        "auto", description="Log lines as JSON, or coloured for people (auto: console on a terminal, else JSON)."
    )
    access_log: bool = Field(True, description="Log one event per request (id, status, latency, batch, queue wait).")
    tracing: bool = Field(
        False,
        description="OpenTelemetry spans per request (needs the `otel` extra); the exporter follows the standard "
        "OTEL_* variables (OTEL_TRACES_EXPORTER=otlp|console|none, OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME).",
    )
    # -- authentication and CORS (README: "Authentication, CORS and limits") --------------------------------------
    api_keys: ApiKeyList = Field(
        default_factory=list,
        repr=False,
        description="API keys accepted as `Authorization: Bearer KEY` or `X-API-Key: KEY` (repeat the flag, or "
        "comma-separate; none: no authentication).",
    )
    api_key_file: Path | None = Field(
        None,
        description="File with more API keys, one per line (`#` comments), each optionally followed by "
        "`priority=N`: the default and highest priority level of that key's requests; read at start-up.",
    )
    metrics_auth: bool = Field(False, description="With API keys on, /metrics needs a key too (default: open).")
    public_docs: bool = Field(
        False, description="With API keys on, /docs and /openapi.json stay open (default: they need a key)."
    )
    rate_limit_per_key: float | None = Field(
        None, gt=0, description="Requests per second each API key may make (429 + Retry-After past it)."
    )
    allow_short_api_keys: bool = Field(
        False,
        description=f"Accept API keys shorter than {MIN_API_KEY_LENGTH} characters (with a warning at start-up; "
        "off: refused, since short keys can be guessed).",
    )
    auth_failures_per_minute: int = Field(
        10,
        ge=0,
        le=1_000_000,
        description="Wrong API keys one client address may send in a minute; then every request from it gets 429 "
        "+ Retry-After for a minute, a correct key included (0: no lockout). Per server process, split over them.",
    )
    forwarded_allow_ips: ProxyList = Field(
        default_factory=lambda: ["127.0.0.1", "::1"],
        description="Proxies (addresses, networks like 10.0.0.0/8, or `*`) whose X-Forwarded-For names the client "
        "address the auth-failure lockout counts (others: the connection's peer).",
    )
    allowed_hosts: HostList = Field(
        default_factory=list,
        description="Host header values served (`api.example`, `.example` for its subdomains, `*` for any); others "
        "get 400 (default: what --host implies: localhost, 127.0.0.1 and ::1 on loopback, any host on 0.0.0.0).",
    )
    cors_origins: CommaList = Field(
        default_factory=list,
        description="Origins browsers may call from (`https://app.example`, or `*` without credentials; none: "
        "no CORS).",
    )
    cors_allow_credentials: bool = Field(
        False, description="Let browsers send credentials cross-origin (needs explicit --cors-origins, not `*`)."
    )
    cors_max_age: int = Field(600, ge=0, le=86_400, description="Seconds browsers may cache a CORS preflight.")
    # -- limits on what a client controls --------------------------------------------------------------------------
    max_instances: int = Field(
        1024,
        ge=1,
        description="Most instances (V1) or batch rows (V2) in one request (else 413); at most --max-queue, which "
        "a larger request could never fit (left unset, it follows a smaller --max-queue).",
    )
    max_tensor_elements: int = Field(
        16 * MiB, ge=1, description="Most tensor elements, all inputs together, in one V2 request (else 413)."
    )
    max_request_line: int = Field(
        MAX_REQUEST_LINE, ge=64, le=MAX_REQUEST_LINE, description="Longest request line, URL included (else 414)."
    )
    max_header_count: int = Field(100, ge=4, le=32_768, description="Most header fields in a request (else 431).")
    max_header_bytes: int = Field(8190, ge=64, le=65_536, description="Longest header field, `name: value` (else 431).")
    # -- many models: a model repository and its control (docs/repository.md) ------------------------------------
    model_repository: Path | None = Field(
        None,
        description="Serve the models of this folder instead of MODEL arguments: DIR/<model>/twinserve.toml (its "
        "class, settings and version policy) and DIR/<model>/<version>/ (numbered version folders).",
    )
    model_control: Literal["none", "explicit", "poll"] = Field(
        "none",
        description="With --model-repository, Triton's model control: none (load every model at start; the "
        "repository API answers the index only), explicit (load at start, then load/unload on request), poll "
        "(load at start, then follow the folder's changes every --repository-poll-s).",
    )
    max_loaded_models: int | None = Field(
        None,
        ge=1,
        description="With --model-repository, most models loaded at once in each server process: the first N by name "
        "load at start, any other on its first request, and the least recently used is unloaded to make room "
        "(unset: no bound, every model loads at start).",
    )
    repository_poll_s: float = Field(
        5.0, gt=0, le=3600, description="With --model-control poll, seconds between two looks at the repository."
    )
    admin_api_key: str | None = Field(
        None,
        repr=False,
        description="With API keys on, the one key that may load and unload models through the repository API "
        "(it is an API key for everything else too; without it, repository changes are refused with 403).",
    )
    admin_api_key_file: Path | None = Field(
        None,
        description="File holding the admin key (one line; `#` comments), read at start-up: unlike "
        "--admin-api-key, it does not show in the process list.",
    )
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0", description="Feature store used by the I/O example (FeatureLookup)."
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags (init) over the settings file over `TWINSERVE_*` over the defaults."""
        path = _SETTINGS_FILE.get()
        if path is None:
            return init_settings, env_settings, dotenv_settings, file_secret_settings
        toml = TomlConfigSettingsSource(settings_cls, toml_file=path)
        return init_settings, toml, env_settings, dotenv_settings, file_secret_settings

    @model_validator(mode="before")
    @classmethod
    def _max_instances_follows_queue(cls, data: Any) -> Any:
        """Left unset, --max-instances follows a --max-queue below its default, so that lowering the queue alone
        still starts, and a request the queue could never hold gets 413 rather than 503 + Retry-After forever."""
        if not isinstance(data, dict) or data.get("max_instances") is not None:
            return data
        try:
            queue = int(data["max_queue"])
        except (KeyError, TypeError, ValueError):
            return data  # unset, or invalid: its own validation says so
        default = cls.model_fields["max_instances"].default
        return {**data, "max_instances": queue} if 1 <= queue < default else data

    @model_validator(mode="before")
    @classmethod
    def _admin_key_file(cls, settings: Any) -> Any:
        return admin_key_from_file(settings)

    @model_validator(mode="after")
    def _check_combinations(self) -> Config:
        if self.default_priority > self.priority_levels:
            raise ValueError(
                f"--default-priority {self.default_priority} is past --priority-levels {self.priority_levels}"
            )
        if self.api_key_file is not None:
            check_file_mode(self.api_key_file, "--api-key-file")
            entries = read_key_file(self.api_key_file)
            if not entries:
                raise ValueError(f"--api-key-file: {self.api_key_file} holds no key")
            for key, priority in entries:
                check_key(key)
                if priority is not None and not 1 <= priority <= self.priority_levels:
                    raise ValueError(
                        f"--api-key-file: a key's priority={priority} is outside 1..{self.priority_levels} "
                        "(--priority-levels)"
                    )
        if not self.allow_short_api_keys and self.auth_enabled:
            short = sum(len(key) < MIN_API_KEY_LENGTH for key in self.all_api_keys())
            if short:
                # Neither the key nor its length is named: the message may reach a log others read.
                raise ValueError(
                    f"{short} API key(s) shorter than {MIN_API_KEY_LENGTH} characters: use longer random keys "
                    "(python -c 'import secrets; print(secrets.token_urlsafe(24))') or --allow-short-api-keys"
                )
        if self.rate_limit_per_key is not None and not self.auth_enabled:
            raise ValueError("--rate-limit-per-key needs API keys (--api-key or --api-key-file)")
        if "*" in self.cors_origins and (self.cors_allow_credentials or len(self.cors_origins) > 1):
            raise ValueError("--cors-origins '*' must stand alone and cannot be combined with --cors-allow-credentials")
        if self.debug and self.workers not in (None, 1):
            raise ValueError("--debug serves from one process: drop --workers or set it to 1")
        if self.arch == "hybrid" and self.executor not in ("auto", "process"):
            raise ValueError("--arch hybrid runs predict in model-worker processes: use --executor process or auto")
        if self.debug and self.resolved_arch_executor == "process":
            raise ValueError("--debug runs everything in one thread: it cannot use model-worker processes")
        self._check_repository()
        if self.max_instances > self.max_queue:
            # A request the queue can never hold would get 503 + Retry-After however often it is retried.
            raise ValueError(
                f"--max-instances {self.max_instances} exceeds --max-queue {self.max_queue}: a request that large "
                "could never be queued"
            )
        return self

    def _check_repository(self) -> None:
        if self.admin_api_key is not None:
            check_key(self.admin_api_key)
        if self.model_repository is None:
            if self.model_control != "none":
                raise ValueError("--model-control needs --model-repository")
            if self.max_loaded_models is not None:
                raise ValueError("--max-loaded-models needs --model-repository: it bounds a repository's models")
            return
        if self.max_loaded_models is not None and self.model_control == "poll":
            # Under poll the folder decides what is loaded; under a bound, the requests do.
            raise ValueError(
                "--max-loaded-models loads models on demand and cannot follow the folder: use --model-control "
                "none or explicit with it"
            )
        if self.models != [DEFAULT_MODEL]:
            raise ValueError("MODEL arguments and --model-repository are exclusive: serve one or the other")
        if not self.model_repository.is_dir():
            raise ValueError(f"--model-repository: {self.model_repository} is not a folder")

    @property
    def auth_enabled(self) -> bool:
        return bool(self.api_keys) or self.api_key_file is not None or self.admin_api_key is not None

    def all_api_keys(self) -> list[str]:
        """The keys given directly, the admin key and those in --api-key-file (read now), without duplicates."""
        keys = list(self.api_keys)
        if self.admin_api_key is not None:
            keys.append(self.admin_api_key)
        if self.api_key_file is not None:
            keys += [key for key, _ in read_key_file(self.api_key_file)]
        return list(dict.fromkeys(keys))

    def api_key_priorities(self) -> dict[str, int]:
        """Each key that --api-key-file gives a `priority=N`, with that level (read now)."""
        if self.api_key_file is None:
            return {}
        return {key: level for key, level in read_key_file(self.api_key_file) if level is not None}

    @property
    def resolved_arch_executor(self) -> str:
        """The executor the architecture implies, before the model's own hooks are known."""
        return "process" if self.arch == "hybrid" and self.executor == "auto" else self.executor

    @property
    def effective_max_batch_size(self) -> int:
        if self.max_batch_size is not None:
            return self.max_batch_size
        return 1 if self.arch == "sync" else 32

    @property
    def effective_ws_max_message_bytes(self) -> int:
        return self.max_body_bytes if self.ws_max_message_bytes is None else self.ws_max_message_bytes

    @property
    def effective_expose_errors(self) -> bool:
        return self.expose_errors or self.debug

    @property
    def effective_workers(self) -> int:
        if self.debug:
            return 1
        if self.workers is not None:
            return self.workers
        return (os.cpu_count() or 1) if self.arch == "sync" else 1


def load_config(config_file: str | Path | None = None, **overrides: Any) -> Config:
    """Build a Config from `overrides` (e.g. CLI flags) over the settings file `config_file` (TOML, keys = field
    names) over `TWINSERVE_*` env vars over defaults.

    Raises ConfigError with a one-line message naming the offending flag (or the file and its key).
    """
    from twinserve.settings_file import check_settings_file

    given = {k: v for k, v in overrides.items() if v is not None}
    path = None if config_file is None else Path(config_file)
    in_file = {} if path is None else check_settings_file(path, Config.model_fields)
    if path is not None and in_file.keys() & {"api_keys", "admin_api_key"}:
        try:
            check_file_mode(path, "--config")  # it holds keys: as for a key file
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    token = _SETTINGS_FILE.set(path)
    try:
        return Config(**given)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"] if isinstance(p, str)) or "config"
        if field in in_file and field not in given:
            raise ConfigError(f"--config: {path}: {field}: {first['msg']}") from None
        if field == "config":  # a check across settings: its message names the flags itself
            cause = first.get("ctx", {}).get("error")
            raise ConfigError(str(cause) if cause is not None else first["msg"]) from None
        raise ConfigError(f"--{field.replace('_', '-')}: {first['msg']}") from None
    finally:
        _SETTINGS_FILE.reset(token)
