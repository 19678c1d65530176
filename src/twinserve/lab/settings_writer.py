"""Writing the settings file `twinserve serve --config` reads (`twinserve.settings_file`), and the equivalent
`twinserve serve ...` command line: what `twinserve tune` hands the user."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from twinserve.cli_args import flag_args
from twinserve.config import Config
from twinserve.secret_settings import secret_fields

__all__ = ["serve_command", "settings_file_text", "toml_value"]


def toml_value(value: Any) -> str:
    """A value in TOML (inline: numbers, booleans, strings, arrays)."""
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
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    raise ValueError(f"{value!r} ({type(value).__name__}) has no TOML spelling here")


def settings_file_text(config: Config, header: str = "") -> str:
    """A settings file that `twinserve serve --config` reads back into `config`: the models and every field off
    its default (unset optional fields are left out: TOML has no null). Secrets are never written
    (twinserve/secret_settings.py): a comment names each one left out, for the environment to supply."""
    secrets = secret_fields(config)
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    for name in sorted(secrets):
        default = type(config).model_fields[name].get_default(call_default_factory=True)
        if getattr(config, name) not in (None, default):
            lines.append(f"# {name} holds a secret: not written here; set TWINSERVE_{name.upper()} where it runs")
    for name, field in type(config).model_fields.items():
        value = getattr(config, name)
        if name in secrets or value is None:
            continue
        if name == "models" and config.model_repository is not None:
            continue  # the repository names the models (and `models` holds only its placeholder default)
        if name != "models" and value == field.get_default(call_default_factory=True):
            continue
        lines.append(f"{name} = {toml_value(value)}")
    return "\n".join(lines) + "\n"


def serve_command(config: Config) -> list[str]:
    """The `twinserve serve ...` line equivalent to `settings_file_text(config)`: the same fields, as flags (the
    secrets left out: the environment supplies them)."""
    secrets = secret_fields(config)
    command = ["twinserve", "serve", *([] if config.model_repository is not None else config.models)]
    for name, field in type(config).model_fields.items():
        value = getattr(config, name)
        if name == "models" or name in secrets or value is None:
            continue
        if name != "arch" and value == field.get_default(call_default_factory=True):
            continue
        command += flag_args(name, value)
    return command
