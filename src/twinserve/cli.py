"""The `twinserve` command line. Its flags are generated from `Config`, so they cannot drift from it."""

from __future__ import annotations

import argparse
import os
import sys
import typing
from collections.abc import Sequence
from typing import Any

from pydantic_core import PydanticUndefined

from twinserve import __version__
from twinserve.config import Config, load_config
from twinserve.errors import ConfigError, ModelImportError
from twinserve.observability.metrics import prepare_multiprocess_dir

__all__ = ["build_parser", "main"]


def _default_text(name: str) -> str:
    field = Config.model_fields[name]
    if field.default_factory is not None:
        return str(field.default_factory())  # type: ignore[call-arg]
    if field.default is PydanticUndefined or field.default is None:
        return "auto"
    return str(field.default).lower() if isinstance(field.default, bool) else str(field.default)


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    for name, field in Config.model_fields.items():
        if name == "models":
            continue
        flag = "--" + name.replace("_", "-")
        help_text = f"{field.description} [env TWINSERVE_{name.upper()}; default {_default_text(name)}]"
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="twinserve",
        description="Serve one model in the sync, async or hybrid architecture; measure them side by side; choose.",
    )
    parser.add_argument("--version", action="version", version=f"twinserve {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="serve MODEL over HTTP",
        description="Serve MODEL(s) over HTTP. Every flag can also be set by its TWINSERVE_* variable.",
    )
    serve.add_argument(
        "models",
        nargs="*",
        metavar="MODEL",
        help="import string `pkg.mod:Class` or `path/file.py:Class` (default: the built-in tabular example)",
    )
    _add_config_flags(serve)
    from twinserve.lab.commands import add_lab_commands

    add_lab_commands(commands)
    from twinserve.deploy.ray import add_ray_command

    add_ray_command(commands, _add_config_flags)
    from twinserve.deploy.commands import add_deploy_commands

    add_deploy_commands(commands, _add_config_flags)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Like uvicorn: `pkg.mod:Class` import strings resolve against the working directory.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    if args.command != "serve":
        try:
            code: int = args.handler(args)
        except ModelImportError as exc:
            print(f"twinserve: error: {exc}", file=sys.stderr)
            return 2
        return code
    overrides: dict[str, Any] = {k: v for k, v in vars(args).items() if k != "command"}
    if not overrides.get("models"):
        overrides.pop("models", None)
    try:
        config = load_config(**overrides)
        # Before anything imports prometheus-client: every process of this server shares one metrics directory.
        prepare_multiprocess_dir()
        from twinserve.servers import serve

        serve(config)
    except (ConfigError, ModelImportError) as exc:
        print(f"twinserve: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
