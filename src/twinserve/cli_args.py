"""Argument types and flags shared by the command-line tools."""

from __future__ import annotations

import argparse
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic_core import PydanticUndefined

from twinserve.config import Config

__all__ = ["add_config_flags", "default_text", "flag_args", "positive"]


def positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type: `kind(text)`, which must be greater than zero."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
        return value

    return parse


def default_text(name: str) -> str:
    """How the default of Config field `name` reads in `--help` and the docs."""
    field = Config.model_fields[name]
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
        return ",".join(value) if isinstance(value, list) and value else str(value)
    if field.default is PydanticUndefined or field.default is None:
        return "auto"
    return str(field.default).lower() if isinstance(field.default, bool) else str(field.default)


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per Config field (but `models`), so the command line cannot drift from the Config, and `--config`
    for a settings file (dest `config_file`, the keyword `load_config` takes)."""
    parser.add_argument(
        "--config",
        dest="config_file",
        type=Path,
        metavar="FILE",
        help='settings file (TOML; keys are the setting names: arch = "async", workers = 2): flags override it, '
        "it overrides TWINSERVE_* and the defaults (`twinserve tune` writes one)",
    )
    for name, field in Config.model_fields.items():
        if name == "models":
            continue
        flag = "--" + name.replace("_", "-")
        help_text = f"{field.description} [env TWINSERVE_{name.upper()}; default {default_text(name)}]"
        annotation = field.annotation
        if annotation is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif typing.get_origin(annotation) is typing.Literal:
            parser.add_argument(flag, choices=typing.get_args(annotation), default=None, help=help_text)
        elif typing.get_origin(annotation) is list:
            # Repeatable, and also spelled in the singular: `--api-key K1 --api-key K2` or `--api-keys K1,K2`.
            flags = [flag, flag.removesuffix("s")] if flag.endswith("s") else [flag]
            parser.add_argument(*flags, dest=name, action="append", default=None, metavar=name.upper(), help=help_text)
        else:
            parser.add_argument(flag, default=None, metavar=name.upper(), help=help_text)


def flag_args(name: str, value: object) -> list[str]:
    """The command-line spelling of Config field `name` set to `value` (`--no-x` for False, lists comma-joined)."""
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return [flag if value else "--no-" + flag[2:]]
    if isinstance(value, list):
        return [flag, ",".join(str(item) for item in value)]
    return [flag, str(value)]
