"""The image the manifests run: python:3.11-slim, twinserve from its own wheel with the extras its models need, the
model modules with the files their models read, a non-root user.

The build context is what `twinserve k8s --out DIR` wrote: the Dockerfile, the wheel of the twinserve that wrote
it (so no index needs this release), and what `twinserve.deploy.context` found, at the same relative paths under
WORKDIR. Comments in the Dockerfile say what the context carries, what it skipped, and why each extra is there.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping, Sequence

from twinserve.config import Config
from twinserve.deploy.context import REPOSITORY_CONTEXT, WORKDIR, BuildContext, Carried
from twinserve.deploy.k8s import READY_PATH, REPOSITORY_PATH, RUN_AS_USER, serve_command

__all__ = ["REPOSITORY_CONTEXT", "WHEEL_DIR", "WORKDIR", "dockerfile", "pip_requirement"]

#: Where the image build puts the wheel before installing it.
WHEEL_DIR = "/tmp/wheels"


def pip_requirement(wheel: str, extras: Sequence[str] = ()) -> str:
    """The wheel copied into the image, with `extras`: `/tmp/wheels/twinserve-0.1.0-py3-none-any.whl[otel]`."""
    return f"{WHEEL_DIR}/{wheel}{'[' + ','.join(extras) + ']' if extras else ''}"


def dockerfile(
    config: Config,
    wheel: str,
    extras: Sequence[str] | Mapping[str, Sequence[str]] = (),
    context: BuildContext | None = None,
    repository_in_image: bool = False,
) -> str:
    """The Dockerfile of a build context holding `wheel` (a file name) and what `context` carries; pip installs the
    wheel with `extras` (a mapping gives each extra's reasons, written beside it). Without a context,
    `repository_in_image` says whether the context holds the model repository (REPOSITORY_CONTEXT)."""
    health = (
        "import sys, urllib.request; "
        f"sys.exit(urllib.request.urlopen('http://127.0.0.1:{config.port}{READY_PATH}', timeout=2).status != 200)"
    )
    wheel_path = f"{WHEEL_DIR}/{wheel}"
    carried = context.carried if context is not None else []
    in_image = context.repository is not None if context is not None else repository_in_image
    lines = [
        "FROM python:3.11-slim",
        "ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1",
        "# twinserve itself: the wheel `twinserve k8s --out` wrote beside this file, of the version that wrote it,",
        *_extras_lines(extras),
        f"COPY {json.dumps([wheel, WHEEL_DIR + '/'])}",
        f"RUN pip install {json.dumps(pip_requirement(wheel, list(extras)))} && rm {wheel_path}",
        f"RUN groupadd --gid {RUN_AS_USER} twinserve \\",
        f" && useradd --uid {RUN_AS_USER} --gid {RUN_AS_USER} --no-create-home --shell /usr/sbin/nologin twinserve",
        f"WORKDIR {WORKDIR}",
        *_model_lines(context),
        *_copies([c for c in carried if str(c.path) != REPOSITORY_CONTEXT]),
        *(_repository_lines() if in_image else []),
        f"USER {RUN_AS_USER}:{RUN_AS_USER}",
        f"EXPOSE {config.port}",
        f"HEALTHCHECK --interval=10s --timeout=3s --start-period=60s CMD {json.dumps(['python', '-c', health])}",
        f"CMD {json.dumps(serve_command(config))}",
    ]
    return "\n".join(lines) + "\n"


def _extras_lines(extras: Sequence[str] | Mapping[str, Sequence[str]]) -> list[str]:
    """Which extras, and why: what `twinserve k8s --out` found in the models' sources, files and settings."""
    if not extras:
        return ["# with no extra: none found in the models' imports, files or settings (add one: k8s --extra NAME)"]
    if not isinstance(extras, Mapping):
        return [f"# with the extras {', '.join(extras)}"]
    return [
        "# with the extras the models need (found in their imports, files and settings; add one: k8s --extra NAME):",
        *(
            line
            for extra, reasons in extras.items()
            for line in textwrap.wrap(
                f"{extra}: {'; '.join(reasons)}", 116, initial_indent="#   ", subsequent_indent="#     "
            )
        ),
    ]


def _model_lines(context: BuildContext | None) -> list[str]:
    if context is None or not context.describe():
        return ["# The model files the command names, at the same paths (none here: its models are installed)"]
    return [
        "# The model files the command names and the files their models read, at the same paths (found by",
        "# `twinserve k8s --out`: a model's `files`, else the files beside its module):",
        *(
            comment
            for line in context.describe()
            for comment in textwrap.wrap(line, 116, initial_indent="#   ", subsequent_indent="#     ")
        ),
    ]


def _copies(carried: Sequence[Carried]) -> list[str]:
    """One COPY per folder carried, and one per folder of the files carried (several sources: one layer), in the
    order found."""
    copies: dict[str, list[str]] = {}  # destination -> sources
    for item in carried:
        if item.is_dir:
            copies[str(item.path)] = [str(item.path)]
        else:
            parent = str(item.path.parent)
            copies.setdefault("./" if parent == "." else parent + "/", []).append(str(item.path))
    return [f"COPY {json.dumps([*sources, destination])}" for destination, sources in copies.items()]


def _repository_lines() -> list[str]:
    return [
        "# The model repository, where the command names it (--model-repository /models)",
        f"COPY {json.dumps([REPOSITORY_CONTEXT, REPOSITORY_PATH])}",
    ]
