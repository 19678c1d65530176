"""Per-model settings: the few `Config` fields one model may set for itself, over the server's own.

A model sets them as a class attribute (`settings = {"max_batch_size": 32, "timeout_ms": 500}`) or in the
`[settings]` table of its `twinserve.toml` in a model repository, which wins over the class; the rest comes from
the server's flags. The result is one more `Config`, validated by `Config` itself, so every cross-field rule holds
per model as it does for the server. Server-wide settings (port, processes, architecture, API keys) are refused
per model with an error that names the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from twinserve.config import Config
from twinserve.errors import ConfigError

__all__ = ["MODEL_SETTINGS", "class_settings", "effective_settings", "model_config"]

#: The `Config` fields a model may set for itself, and nothing else.
MODEL_SETTINGS = (
    "max_batch_size",
    "max_batch_delay_ms",
    "executor",
    "model_workers",
    "max_queue",
    "max_queue_wait_ms",
    "timeout_ms",
    "cache_size",
    "cache_ttl_s",
    "default_priority",
)


def class_settings(model_class: type) -> dict[str, Any]:
    """The `settings` class attribute of a model (a mapping of per-model keys; none: {})."""
    declared = getattr(model_class, "settings", None)
    if declared is None:
        return {}
    if not isinstance(declared, Mapping):
        raise ConfigError(
            f"{model_class.__qualname__}.settings must be a dict of per-model settings, got {type(declared).__name__}"
        )
    return dict(declared)


def model_config(config: Config, settings: Mapping[str, Any], model: str) -> Config:
    """`config` with `model`'s own `settings` over it, validated as a whole; ConfigError names the bad key."""
    if not settings:
        return config
    for key in settings:
        if key not in MODEL_SETTINGS:
            kind = "a server-wide setting" if key in Config.model_fields else "not a setting"
            raise ConfigError(
                f"model {model!r}: settings key {key!r} is {kind}; a model may set only {', '.join(MODEL_SETTINGS)}"
            )
    values = {**config.model_dump(), **settings}
    if "max_queue" in settings:
        # A request larger than this model's queue could never be queued: 413 for it, as Config does server-wide.
        values["max_instances"] = min(config.max_instances, values["max_queue"])
    try:
        return Config.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"] if isinstance(p, str))
        where = f"settings key {field!r}" if field else "settings"
        message = str(first["msg"]).removeprefix("Value error, ")
        raise ConfigError(f"model {model!r}: {where}: {message}") from None


def effective_settings(config: Config) -> dict[str, Any]:
    """The per-model settings `config` holds (what a model's metadata shows), defaults resolved where known."""
    values = {key: getattr(config, key) for key in MODEL_SETTINGS}
    values["max_batch_size"] = config.effective_max_batch_size
    return values
