"""How a model repository is laid out on disk, read into plain values (no import of model code here).

    DIR/<model>/twinserve.toml       model = "model.py:Classifier"; [settings]; versions = ...; [traffic]
    DIR/<model>/<version>/model.py   numbered version folders; a version's files live beside its model.py
    DIR/<model>/model.py             (no version folder: the model folder itself is version 1)

The folder's name is the served model name; `versions` is Triton's version policy (`"all"`, `{latest = N}`,
`{specific = [...]}`), and the highest served number is the default version. A folder that cannot be read
becomes a `ModelFolder` with its `error` set: that model is unavailable with that reason, the others served.
"""

from __future__ import annotations

import re
import tomllib
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twinserve.repository.traffic import TrafficPolicy

__all__ = ["SETTINGS_FILE", "ModelFolder", "VersionFolder", "read_model", "read_repository"]

SETTINGS_FILE = "twinserve.toml"
_KEYS = frozenset({"model", "settings", "traffic", "versions"})
_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


@dataclass(frozen=True)
class VersionFolder:
    """One version of a model: where its files are and how to import its class."""

    version: int
    folder: Path
    #: The import string of its class, `path/to/model.py:Class`.
    target: str
    #: A module name of its own, so that two versions' `model.py` never share one module (core/runtime.py).
    module: str


@dataclass(frozen=True)
class ModelFolder:
    """One model folder: its served name, per-model settings and the versions its policy serves."""

    name: str
    folder: Path
    settings: dict[str, Any] = field(default_factory=dict)
    versions: tuple[VersionFolder, ...] = ()
    #: Its `[traffic]` table: split and shadow across its versions (None: the default version takes all).
    traffic: TrafficPolicy | None = None
    #: Why the folder cannot be served (None: it can; its versions may still fail to import or load).
    error: str | None = None

    @property
    def default_version(self) -> int | None:
        return max((v.version for v in self.versions), default=None)


def read_repository(root: Path) -> list[ModelFolder]:
    """Every model folder of `root` (hidden folders and files at the top are skipped), sorted by name."""
    return [read_model(folder) for folder in sorted(root.iterdir()) if folder.is_dir() and _visible(folder)]


def read_model(folder: Path) -> ModelFolder:
    """One model folder, its problems as `error` rather than raised."""
    name = folder.name
    try:
        document = _settings_file(folder)
        settings, policy = _settings(document), document.get("versions", "all")
        present = _version_folders(folder)
        chosen = _apply_policy(policy, sorted(present))
        traffic = _traffic(document, chosen)
    except ValueError as exc:
        return ModelFolder(name, folder, error=f"{folder / SETTINGS_FILE}: {exc}")
    entry = str(document["model"])
    versions = tuple(_version(name, present.get(number, folder), number, entry) for number in chosen)
    return ModelFolder(name, folder, settings, versions, traffic)


def _visible(path: Path) -> bool:
    return not path.name.startswith((".", "_"))


def _settings_file(folder: Path) -> dict[str, Any]:
    path = folder / SETTINGS_FILE
    if not path.is_file():
        raise ValueError('missing: every model folder holds one, with at least `model = "model.py:Class"`')
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"cannot be read: {exc}") from None
    unknown = sorted(set(document) - _KEYS)
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)} (allowed: {', '.join(sorted(_KEYS))})")
    model = document.get("model")
    if not isinstance(model, str) or ":" not in model:
        raise ValueError('`model` must name the class as "file.py:Class", relative to the version folder')
    return document


def _settings(document: dict[str, Any]) -> dict[str, Any]:
    settings = document.get("settings", {})
    if not isinstance(settings, dict):
        raise ValueError("[settings] must be a table of per-model settings")
    return settings


def _traffic(document: dict[str, Any], chosen: list[int]) -> TrafficPolicy | None:
    """The `[traffic]` table, naming only versions the policy serves (repository/traffic.py)."""
    table = document.get("traffic")
    return None if table is None else TrafficPolicy.parse(table, [str(number) for number in chosen])


def _version_folders(folder: Path) -> dict[int, Path]:
    """The numbered folders of a model; none means the model folder itself is version 1."""
    numbered = {int(p.name): p for p in folder.iterdir() if p.is_dir() and p.name.isdigit() and int(p.name) > 0}
    return numbered or {1: folder}


def _apply_policy(policy: Any, present: list[int]) -> list[int]:
    """The version numbers `policy` serves out of those `present` (ascending)."""
    if policy == "all":
        return present
    if isinstance(policy, dict) and len(policy) == 1:
        ((kind, value),) = policy.items()
        if kind == "latest" and isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return present[-value:]
        if kind == "specific" and isinstance(value, list) and value and all(isinstance(v, int) for v in value):
            missing = sorted(set(value) - set(present))
            if missing:
                raise ValueError(f"versions.specific names {missing}, not among the version folders {present}")
            return sorted(set(value))
    raise ValueError('versions must be "all", {latest = N} (N >= 1) or {specific = [1, 3]}')


def _version(name: str, folder: Path, number: int, entry: str) -> VersionFolder:
    file, _, cls = entry.rpartition(":")
    target = f"{folder / file}:{cls}"
    module = f"twinserve_repository_{_UNSAFE.sub('_', name)}_{number}_{zlib.crc32(str(folder).encode()):08x}"
    return VersionFolder(number, folder, target, module)
