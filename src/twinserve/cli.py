"""The `twinserve` command line: one registry of commands, each built (and its module imported) only when used.

`twinserve --help` imports no command's module; `twinserve bench ...` imports the lab, never Ray. The flags of
`serve`, `ray` and `k8s` are generated from `Config` (`twinserve.cli_args`), so they cannot drift from it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from twinserve import __version__
from twinserve.errors import ConfigError, ModelImportError

__all__ = ["COMMANDS", "Command", "build_parser", "main"]


@dataclass(frozen=True)
class Command:
    """One subcommand: its one-line help, and `module:function` that adds its arguments and handler."""

    help: str
    adds: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        module, _, function = self.adds.partition(":")
        adder: Callable[[argparse.ArgumentParser], None] = getattr(importlib.import_module(module), function)
        adder(parser)


COMMANDS: dict[str, Command] = {
    "serve": Command("serve MODEL over HTTP", "twinserve.cli:add_serve"),
    "bench": Command(
        "serve MODEL in every architecture, load each side by side, report and advise",
        "twinserve.lab.commands:add_bench",
    ),
    "advise": Command(
        "pick the architecture and settings that meet a latency objective, from bench results",
        "twinserve.lab.commands:add_advise",
    ),
    "tune": Command(
        "search the settings that meet a latency objective (open-loop load, a server per probe); or --verify a URL",
        "twinserve.lab.commands:add_tune",
    ),
    "locustfile": Command(
        "write a Locust file that load-tests MODEL's predict endpoint with its examples",
        "twinserve.lab.commands:add_locustfile",
    ),
    "ray": Command(
        "serve MODEL(s) on Ray Serve, the same HTTP contract as `serve --arch async`", "twinserve.deploy.ray:add_ray"
    ),
    "k8s": Command(
        "write Kubernetes/KServe manifests and a Dockerfile that run `twinserve serve` with these flags",
        "twinserve.deploy.commands:add_k8s",
    ),
}


def _chosen(argv: Sequence[str]) -> str | None:
    """The command `argv` names: its first word that is not an option (the top level's take no values)."""
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line; given `argv`, only the command it names gets its arguments (and its imports)."""
    parser = argparse.ArgumentParser(
        prog="twinserve",
        description="Serve one model in the sync, async or hybrid architecture; measure them side by side; choose.",
    )
    parser.add_argument("--version", action="version", version=f"twinserve {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = None if argv is None else _chosen(argv)
    for name, command in COMMANDS.items():
        sub = commands.add_parser(name, help=command.help, description=command.help)
        if argv is None or name == chosen:
            command.add_arguments(sub)
    return parser


def add_serve(parser: argparse.ArgumentParser) -> None:
    from twinserve.cli_args import add_config_flags

    parser.description = "Serve MODEL(s) over HTTP. Every flag can also be set by its TWINSERVE_* variable."
    parser.add_argument(
        "models",
        nargs="*",
        metavar="MODEL",
        help="import string `pkg.mod:Class` or `path/file.py:Class` (default: the built-in tabular example)",
    )
    add_config_flags(parser)


def _serve(args: argparse.Namespace) -> int:
    from twinserve.config import load_config

    overrides: dict[str, Any] = {k: v for k, v in vars(args).items() if k != "command"}
    if not overrides.get("models"):
        overrides.pop("models", None)
    config = load_config(**overrides)
    # Before anything imports prometheus-client: every process of this server shares one metrics directory.
    from twinserve.observability.metrics import prepare_multiprocess_dir

    prepare_multiprocess_dir()
    from twinserve.servers import serve
    from twinserve.servers.startup import StartupFailed

    try:
        serve(config)
    except StartupFailed as exc:  # a model that would not load, in whichever process: one line, like a bad flag
        print(f"twinserve: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    # Like uvicorn: `pkg.mod:Class` import strings resolve against the working directory.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        args = build_parser(words).parse_args(words)
        # serve's namespace is exactly its Config overrides (and `command`); the others name their handler.
        code: int = _serve(args) if args.command == "serve" else args.handler(args)
    except (ConfigError, ModelImportError) as exc:
        print(f"twinserve: error: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
