"""The settings file `twinserve serve --config FILE.toml` reads, and the one `twinserve tune` writes.

Its keys are `Config` field names (`arch = "async"`, `workers = 2`, `max_batch_size = 16`). Reading is
pydantic-settings' `TomlConfigSettingsSource`, placed by `Config.settings_customise_sources` between the flags and
the environment; this module only checks a file before that source reads it (pydantic-settings skips a missing
file silently, and names an unknown key "Extra inputs are not permitted"); `twinserve.lab.settings_writer` writes one.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from twinserve.errors import ConfigError

__all__ = ["check_settings_file"]


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
