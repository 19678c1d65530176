"""What `twinserve tune` tunes: a MODEL, or one model of a `--model-repository`; and how a candidate reaches it.

A model's own per-model settings win over the server's flags, so for such a model a candidate's model-level
knobs (`MODEL_KNOBS`) are served from a scratch repository holding that model alone, whose `twinserve.toml` puts
the knobs over the model's own settings; its code and files stay the user's (links or a one-line import). A model
with no settings of its own is served with MODEL and every knob as a flag.
"""

from __future__ import annotations

import hashlib
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twinserve.errors import ConfigError
from twinserve.lab.settings_writer import toml_value
from twinserve.lab.variants import Variant

__all__ = [
    "MODEL_KNOBS",
    "TuneSubject",
    "candidate_settings",
    "model_level",
    "probe_args",
    "server_flags",
    "server_level",
    "settings_table",
    "subject",
]

#: The per-model settings the search may set (`twinserve.core.settings.MODEL_SETTINGS` has more: a model keeps
#: those as it sets them).
MODEL_KNOBS = ("max_batch_size", "max_batch_delay_ms", "model_workers", "executor")


@dataclass(frozen=True)
class TuneSubject:
    """The model tuned. `model` is importable (`pkg.mod:Class`, `file.py:Class`): the in-process measurement
    and the examples use it. `settings` is None for a model with none of its own (flags reach it)."""

    model: str
    name: str
    settings: dict[str, Any] | None = None
    repository: Path | None = None  # the user's repository, with `name` its folder
    module: str | None = None  # the module name a repository version is imported under
    bodies: list[bytes] = field(default_factory=list)

    @property
    def per_model(self) -> bool:
        return self.settings is not None


def server_flags(variant: Variant) -> list[str]:
    """The `twinserve serve` flags of a candidate."""
    flags: list[str] = []
    for name, value in variant.settings.items():
        if value is not None:
            flags += ["--" + name.replace("_", "-"), str(value)]
    return flags


def model_level(variant: Variant) -> dict[str, Any]:
    """A candidate's model-level knobs."""
    return {k: v for k, v in variant.settings.items() if k in MODEL_KNOBS and v is not None}


def server_level(variant: Variant) -> dict[str, Any]:
    """A candidate's server-wide settings (workers, threads)."""
    return {k: v for k, v in variant.settings.items() if k not in MODEL_KNOBS and v is not None}


def _examples(cls: type) -> tuple[str, list[bytes]]:
    import orjson

    from twinserve.model import ModelSpec
    from twinserve.protocol.v1 import json_default

    spec = ModelSpec(cls())
    examples = spec.examples() or []
    return spec.name, [orjson.dumps({"instances": [e]}, default=json_default) for e in examples]


def subject(model: str | None, repository: Path | None = None, name: str | None = None) -> TuneSubject:
    """Resolve `tune`'s arguments: MODEL, or `--model-repository DIR --model NAME` (ConfigError when wrong)."""
    from twinserve.core.settings import class_settings
    from twinserve.model import import_model

    if repository is None:
        assert model is not None
        cls = import_model(model)  # a bad MODEL: one line, before anything starts
        served, bodies = _examples(cls)
        own = class_settings(cls)
        return TuneSubject(model, served, own or None, bodies=bodies)
    from twinserve.repository.layout import read_model

    if name is None:
        raise ConfigError("--model-repository needs --model NAME: the model folder to tune")
    repository = repository.resolve()
    folder = repository / name
    if not folder.is_dir():
        raise ConfigError(f"--model {name}: no such model folder in {repository}")
    found = read_model(folder)
    if found.error is not None:
        raise ConfigError(f"--model {name}: {found.error}")
    version = max(found.versions, key=lambda v: v.version)  # the default version: the unversioned routes'
    cls = import_model(version.target, version.module)
    _, bodies = _examples(cls)
    # The repository's [settings] win over the class's (as the server reads them).
    own = {**class_settings(cls), **found.settings}
    return TuneSubject(version.target, name, own, repository, version.module, bodies)


def _scratch_model(subject: TuneSubject, settings: Mapping[str, Any], folder: Path) -> None:
    """`folder` becomes a model folder serving the subject with `settings` as its [settings] table."""
    folder.mkdir(parents=True)
    lines: list[str] = []
    if subject.repository is not None:
        source = subject.repository / subject.name
        document = tomllib.loads((source / "twinserve.toml").read_text(encoding="utf-8"))
        lines.append(f"model = {toml_value(document['model'])}")
        if "versions" in document:
            lines.append(f"versions = {_inline(document['versions'])}")
        numbered = [p for p in source.iterdir() if p.is_dir() and p.name.isdigit() and int(p.name) > 0]
        for version in numbered or [source]:  # none: the model folder itself is version 1
            (folder / (version.name if numbered else "1")).symlink_to(version.resolve(), target_is_directory=True)
    else:
        module, _, attr = subject.model.rpartition(":")
        if module.endswith(".py"):
            lines.append(f"model = {toml_value(str(Path(module).resolve()) + ':' + attr)}")
        else:
            (folder / "model.py").write_text(f"from {module} import {attr}\n", encoding="utf-8")
            lines.append(f"model = {toml_value('model.py:' + attr)}")
    lines.append("")
    lines.append(settings_table(settings))
    (folder / "twinserve.toml").write_text("\n".join(lines), encoding="utf-8")


def _inline(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_inline(v)}" for k, v in value.items()) + "}"
    return toml_value(value)


def settings_table(settings: Mapping[str, Any]) -> str:
    """A `[settings]` table (TOML)."""
    return "\n".join(["[settings]", *(f"{k} = {toml_value(v)}" for k, v in settings.items() if v is not None)]) + "\n"


def candidate_settings(subject: TuneSubject, variant: Variant) -> dict[str, Any]:
    """The model's [settings] for a candidate: its own, with the candidate's knobs over them."""
    return {**(subject.settings or {}), **model_level(variant)}


def probe_args(subject: TuneSubject, variant: Variant, scratch: Path) -> tuple[list[str], list[str]]:
    """(MODEL arguments, flags) of `twinserve serve` for a candidate; a scratch repository under `scratch` when
    the model has settings of its own."""
    if not subject.per_model:
        return [subject.model], server_flags(variant)
    settings = candidate_settings(subject, variant)
    key = hashlib.sha256(repr(sorted(settings.items())).encode()).hexdigest()[:12]
    repository = scratch / f"repository-{key}"
    if not repository.exists():
        _scratch_model(subject, settings, repository / subject.name)
    return [], ["--model-repository", str(repository), *server_flags(Variant(variant.arch, server_level(variant)))]
