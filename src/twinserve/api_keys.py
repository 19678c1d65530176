"""API keys as settings carry them: the key file's format and what a key may be (the Config checks both at start)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

__all__ = ["MIN_API_KEY_LENGTH", "admin_key_from_file", "check_file_mode", "check_key", "read_key_file"]

logger = logging.getLogger("twinserve.config")

#: Shorter API keys are refused at start-up (unless --allow-short-api-keys): 16 random characters from the
#: visible ASCII set is about 100 bits, out of reach of any guessing the auth-failure lockout lets through.
MIN_API_KEY_LENGTH = 16


def read_key_file(path: Path) -> list[tuple[str, int | None]]:
    """API keys from a file: one per line, each optionally followed by `priority=N`, the highest priority level
    (and the default) of that key's requests; blank lines and lines starting with `#` are skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc.__class__.__name__}") from None
    entries: list[tuple[str, int | None]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, *options = line.split()
        priority = None
        for option in options:
            name, _, value = option.partition("=")
            if name != "priority" or not value.isdigit():
                # The line is named by number only: it holds a key.
                raise ValueError(f"{path}:{number}: after the key only `priority=N` may follow")
            priority = int(value)
        entries.append((key, priority))
    return entries


def check_file_mode(path: Path, what: str) -> None:
    """Refuse a file holding keys that every account may write (any of them could add a key of its own), and warn
    about one that other accounts may read or its group write, as ssh and PostgreSQL do with private keys: a
    warning, not a refusal, because Kubernetes mounts a Secret's files 0644 unless told otherwise (`defaultMode`),
    and a user-private group (umask 002) makes files 0664."""
    if os.name != "posix":
        return
    try:
        mode = path.stat().st_mode & 0o777
    except OSError:
        return  # reading it names the problem
    if mode & 0o002:
        raise ValueError(f"{what}: {path} may be written by every account (mode {mode:04o}): chmod 600 it")
    if mode & 0o064:
        logger.warning("%s: %s holds keys and other accounts may read it (mode %04o): chmod 600 it", what, path, mode)


def admin_key_from_file(settings: Any) -> Any:
    """The settings (before validation) with `admin_api_key` read from `admin_api_key_file` when one is named: a
    key given as a flag shows in `ps` output, a file does not. Both may be given only when they agree (the server's
    workers validate the settings again, with the key read)."""
    if not isinstance(settings, dict) or not settings.get("admin_api_key_file"):
        return settings
    key = _read_admin_key_file(Path(settings["admin_api_key_file"]))
    if settings.get("admin_api_key") not in (None, key):
        raise ValueError("--admin-api-key and --admin-api-key-file: give one")
    return {**settings, "admin_api_key": key}


def _read_admin_key_file(path: Path) -> str:
    """The admin key in `path`: its one line that is neither blank nor a `#` comment."""
    check_file_mode(path, "--admin-api-key-file")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc.__class__.__name__}") from None
    keys = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if len(keys) != 1:
        raise ValueError(f"--admin-api-key-file: {path} must hold one key, on a line of its own")
    return keys[0]


def check_key(key: str) -> None:
    """A key's characters, checked without putting the key in the message."""
    # Keys travel in headers: visible ASCII only, no spaces. The key itself never goes into the message.
    if not key or not all("!" <= c <= "~" for c in key):
        raise ValueError("an API key must be non-empty visible ASCII without spaces")
