"""A Dockerfile for the image the manifests run: python:3.11-slim, twinserve from pip, a non-root user."""

from __future__ import annotations

import json
from collections.abc import Sequence

from twinserve import __version__
from twinserve.config import Config
from twinserve.deploy.k8s import READY_PATH, RUN_AS_USER, serve_command

__all__ = ["dockerfile", "pip_requirement"]


def pip_requirement(extras: Sequence[str] = ()) -> str:
    """`twinserve[extra,...]==<this version>`: the image runs the version that wrote the manifests."""
    return f"twinserve{'[' + ','.join(extras) + ']' if extras else ''}=={__version__}"


def dockerfile(config: Config, requirement: str) -> str:
    health = (
        "import sys, urllib.request; "
        f"sys.exit(urllib.request.urlopen('http://127.0.0.1:{config.port}{READY_PATH}', timeout=2).status != 200)"
    )
    lines = [
        "FROM python:3.11-slim",
        "ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1",
        f"RUN pip install {json.dumps(requirement)}",
        f"RUN groupadd --gid {RUN_AS_USER} twinserve \\",
        f" && useradd --uid {RUN_AS_USER} --gid {RUN_AS_USER} --no-create-home --shell /usr/sbin/nologin twinserve",
        "WORKDIR /app",
        "# A model given as `path/file.py:Class` or an uninstalled package must be copied here, e.g. COPY model.py .",
        f"USER {RUN_AS_USER}:{RUN_AS_USER}",
        f"EXPOSE {config.port}",
        f"HEALTHCHECK --interval=10s --timeout=3s --start-period=60s CMD {json.dumps(['python', '-c', health])}",
        f"CMD {json.dumps(serve_command(config))}",
    ]
    return "\n".join(lines) + "\n"
