"""The image the manifests run: python:3.11-slim, twinserve from its own wheel, the model's files, a non-root user.

`twinserve k8s --out DIR` makes DIR the image's build context (`docker build DIR`): the Dockerfile, the wheel of
the twinserve that wrote it (`twinserve.deploy.wheel`: no index needs to have this release) and a copy of each
model file the command names — `path/file.py:Class`, or a `pkg.mod:Class` whose package sits uninstalled in the
working directory — at the same relative path under the image's WORKDIR, where the command finds it. A model
repository (`--model-repository DIR`) is copied into the context as `REPOSITORY_CONTEXT` and into the image at
`REPOSITORY_PATH`, where the command names it; unless it comes from a volume (`--repository-volume`).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from twinserve.config import Config
from twinserve.deploy.k8s import READY_PATH, REPOSITORY_PATH, RUN_AS_USER, serve_command
from twinserve.deploy.wheel import DIST_NAME
from twinserve.errors import ConfigError

__all__ = [
    "REPOSITORY_CONTEXT",
    "WHEEL_DIR",
    "copy_model_files",
    "copy_repository",
    "dockerfile",
    "model_files",
    "pip_requirement",
]

#: Where the image build puts the wheel before installing it.
WHEEL_DIR = "/tmp/wheels"
WORKDIR = "/app"
#: The model repository's folder in the build context.
REPOSITORY_CONTEXT = "model-repository"


def pip_requirement(wheel: str, extras: Sequence[str] = ()) -> str:
    """The wheel copied into the image, with `extras`: `/tmp/wheels/twinserve-0.1.0-py3-none-any.whl[otel]`."""
    return f"{WHEEL_DIR}/{wheel}{'[' + ','.join(extras) + ']' if extras else ''}"


def model_files(config: Config, cwd: Path) -> list[PurePosixPath]:
    """The files and folders under `cwd` the models import, as the relative paths the command uses.

    `path/file.py:Class` is that file (it must lie under `cwd`, given relative to it, so the image holds it at
    the same path); `pkg.mod:Class` is `pkg/` or `pkg.py` when one is in `cwd` (import strings resolve against
    the working directory), else an installed package, which has nothing to copy.
    """
    found: list[PurePosixPath] = []
    for target in config.models:
        module = target.rpartition(":")[0]
        if module.endswith(".py"):
            path = Path(module)
            if path.is_absolute() or ".." in path.parts:
                raise ConfigError(
                    f"--out: give the model file {module!r} relative to the current folder and inside it, so the "
                    f"image can hold it at the same path under {WORKDIR}"
                )
            if not (cwd / path).is_file():
                raise ConfigError(f"--out: no such model file: {module}")
            found.append(PurePosixPath(path.as_posix()))
            continue
        top = module.split(".")[0]
        if top == DIST_NAME:
            continue  # in the wheel
        for candidate in (PurePosixPath(top), PurePosixPath(f"{top}.py")):
            if (cwd / candidate).exists():
                found.append(candidate)
                break
    return sorted(set(found))


def copy_model_files(files: Sequence[PurePosixPath], cwd: Path, out_dir: Path) -> None:
    """Copy `files` (from `model_files`) from `cwd` into the build context at the same relative paths."""
    for relative in files:
        source, target = cwd / relative, out_dir / relative
        if source.resolve() == target.resolve():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)


def copy_repository(repository: Path, out_dir: Path) -> Path:
    """Copy the model repository into the build context as REPOSITORY_CONTEXT (afresh: no stale versions)."""
    target = out_dir / REPOSITORY_CONTEXT
    if target.resolve() == repository.resolve():
        return target  # the context already is the repository's home
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(repository, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def dockerfile(
    config: Config,
    wheel: str,
    extras: Sequence[str] = (),
    files: Sequence[PurePosixPath] = (),
    repository_in_image: bool = False,
) -> str:
    """The Dockerfile of a build context holding `wheel` (a file name) and the model `files` (relative paths),
    and with `repository_in_image` the model repository (REPOSITORY_CONTEXT, copied to REPOSITORY_PATH)."""
    health = (
        "import sys, urllib.request; "
        f"sys.exit(urllib.request.urlopen('http://127.0.0.1:{config.port}{READY_PATH}', timeout=2).status != 200)"
    )
    wheel_path = f"{WHEEL_DIR}/{wheel}"
    lines = [
        "FROM python:3.11-slim",
        "ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1",
        "# twinserve itself: the wheel `twinserve k8s --out` wrote beside this file, of the version that wrote it",
        f"COPY {json.dumps([wheel, WHEEL_DIR + '/'])}",
        f"RUN pip install {json.dumps(pip_requirement(wheel, extras))} && rm {wheel_path}",
        f"RUN groupadd --gid {RUN_AS_USER} twinserve \\",
        f" && useradd --uid {RUN_AS_USER} --gid {RUN_AS_USER} --no-create-home --shell /usr/sbin/nologin twinserve",
        f"WORKDIR {WORKDIR}",
        "# The model files the command names, at the same paths; COPY here anything else they load (weights...)",
        *(f"COPY {json.dumps([str(path), str(path)])}" for path in files),
        *(_repository_lines() if repository_in_image else []),
        f"USER {RUN_AS_USER}:{RUN_AS_USER}",
        f"EXPOSE {config.port}",
        f"HEALTHCHECK --interval=10s --timeout=3s --start-period=60s CMD {json.dumps(['python', '-c', health])}",
        f"CMD {json.dumps(serve_command(config))}",
    ]
    return "\n".join(lines) + "\n"


def _repository_lines() -> list[str]:
    return [
        "# The model repository, where the command names it (--model-repository /models)",
        f"COPY {json.dumps([REPOSITORY_CONTEXT, REPOSITORY_PATH])}",
    ]
