"""The settings file `twinserve serve --config FILE.toml` reads, and the one `twinserve tune` writes.

Its keys are `Config` field names (`arch = "async"`, `workers = 2`, `max_batch_size = 16`). Reading is
pydantic-settings' `TomlConfigSettingsSource`, placed by `Config.settings_customise_sources` between the flags and
the environment; this module only checks a file before that source reads it (pydantic-settings skips a missing
file silently, and names an unknown key "Extra inputs are not permitted") and writes one.
"""

from __future__ import annotations

import difflib
import json
import math
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twinserve.errors import ConfigError

if TYPE_CHECKING:
    from twinserve.config import Config

__all__ = ["check_settings_file", "serve_command", "settings_file_text"]


def check_settings_file(path: Path, fields: Iterable[str]) -> dict[str, Any]:
    """The settings in `path`, refused with a ConfigError naming the file (and the key) when it cannot serve.

    `fields` are the names a key may take. Keys are checked here, before validation, so that the message names
    the file and suggests the field meant (`max-batch-size` -> `max_batch_size`).
    """
    try:
        with path.open("rb") as file:
            settings = tomllib.load(file)
    except FileNotFoundError:
        raise ConfigError(f"--config: no such file: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config: cannot read {path}: {exc.__class__.__name__}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--config: {path} is not valid TOML: {exc}") from None
    names = list(fields)
    for key, value in settings.items():
        if isinstance(value, dict):
            raise ConfigError(f"--config: {path}: {key!r} is a table; settings are plain `name = value` lines")
        if key not in names:
            close = difflib.get_close_matches(key.replace("-", "_"), names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"--config: {path}: unknown setting {key!r}{hint}")
    return settings


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value} has no TOML spelling")
        return repr(value)
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str):
        # A JSON string is a TOML basic string: the same quotes and backslash escapes (\n, \", \\, \uXXXX).
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise ValueError(f"{value!r} ({type(value).__name__}) has no TOML spelling here")


def settings_file_text(config: Config, header: str = "", *, omit: Iterable[str] = ("api_keys",)) -> str:
    """A settings file that `twinserve serve --config` reads back into `config`: the models and every field off
    its default (unset optional fields are left out: TOML has no null). API keys are never written."""
    skip = set(omit)
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    for name, field in type(config).model_fields.items():
        value = getattr(config, name)
        if name in skip or value is None:
            continue
        if name != "models" and value == field.get_default(call_default_factory=True):
            continue
        lines.append(f"{name} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def serve_command(config: Config) -> list[str]:
    """The `twinserve serve ...` line equivalent to `settings_file_text(config)`: the same fields, as flags."""
    command = ["twinserve", "serve", *config.models]
    for name, field in type(config).model_fields.items():
        value = getattr(config, name)
        if name in ("models", "api_keys") or value is None:
            continue
        if name != "arch" and value == field.get_default(call_default_factory=True):
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            command.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, list):
            command += [flag, ",".join(value)]
        else:
            command += [flag, str(value)]
    return command
