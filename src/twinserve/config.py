"""The one configuration object.

Every setting is a field of `Config`. The CLI builds its flags from these fields (so `--help` can never drift
from what the server accepts) and `TWINSERVE_<FIELD>` environment variables fill whatever the command line
leaves unset. Cross-field rules live in `Config` too, so invalid settings fail before any port is bound.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from twinserve.errors import ConfigError

__all__ = ["DEFAULT_MODEL", "Architecture", "Config", "load_config"]

Architecture = Literal["sync", "async"]
DEFAULT_MODEL = "twinserve.examples.tabular:Classifier"

MiB = 1024 * 1024


class Config(BaseSettings):
    """Settings for one `twinserve serve` (CLI flag `--x-y` or env `TWINSERVE_X_Y` for field `x_y`)."""

    model_config = SettingsConfigDict(env_prefix="TWINSERVE_", extra="forbid", frozen=True)

    models: list[str] = Field(
        default_factory=lambda: [DEFAULT_MODEL],
        min_length=1,
        description="Model import strings, `pkg.mod:Class` or `path/file.py:Class`.",
    )
    arch: Architecture = Field("sync", description="Serving architecture.")
    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(8000, ge=0, le=65535, description="Port to bind (0: any free port).")
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
        "gthread", description="Gunicorn worker class for --arch sync (`sync`: one request per process)."
    )
    debug: bool = Field(False, description="Serve every request in one foreground thread so breakpoint()/pdb work.")
    max_body_bytes: int = Field(16 * MiB, ge=1, description="Largest request body accepted (else 413).")
    graceful_timeout: float = Field(30.0, ge=0, description="Seconds in-flight requests get to finish after SIGTERM.")
    log_level: Literal["debug", "info", "warning", "error", "critical"] = Field("info", description="Log level.")
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0", description="Feature store used by the I/O example (FeatureLookup)."
    )

    @model_validator(mode="after")
    def _check_combinations(self) -> Config:
        if self.debug and self.workers not in (None, 1):
            raise ValueError("--debug serves from one process: drop --workers or set it to 1")
        return self

    @property
    def effective_workers(self) -> int:
        if self.debug:
            return 1
        if self.workers is not None:
            return self.workers
        return (os.cpu_count() or 1) if self.arch == "sync" else 1


def load_config(**overrides: Any) -> Config:
    """Build a Config from `overrides` (e.g. CLI flags) over `TWINSERVE_*` env vars over defaults.

    Raises ConfigError with a one-line message naming the offending flag.
    """
    try:
        return Config(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"] if isinstance(p, str)) or "config"
        flag = "--" + field.replace("_", "-") if field != "config" else "settings"
        raise ConfigError(f"{flag}: {first['msg']}") from None
