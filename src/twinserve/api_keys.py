"""API keys as settings carry them: the key file's format and what a key may be (the Config checks both at start)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["MIN_API_KEY_LENGTH", "check_key", "read_key_file"]

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


def check_key(key: str) -> None:
    """A key's characters, checked without putting the key in the message."""
    # Keys travel in headers: visible ASCII only, no spaces. The key itself never goes into the message.
    if not key or not all("!" <= c <= "~" for c in key):
        raise ValueError("an API key must be non-empty visible ASCII without spaces")
