"""A wheel of the twinserve that is running, for the image `twinserve k8s --out DIR` describes.

A user's image build cannot count on an index that has this release, so the build context gets twinserve itself:
the package folder that is running (whatever it was installed from: a wheel, an editable checkout) and its
metadata (dependencies and extras, the `twinserve` script: from the checkout's pyproject.toml when it runs from
one, else from the installed distribution) packed as a pure-Python wheel, which
`pip install "twinserve-<version>-py3-none-any.whl[extra]"` installs in the image. Its bytes depend only on the
files, not on when it was written, so the image's pip layer is cached until twinserve changes.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import tomllib
import zipfile
from pathlib import Path

import twinserve
from twinserve import __version__
from twinserve.errors import ConfigError

__all__ = ["DIST_NAME", "wheel_name", "write_wheel"]

DIST_NAME = "twinserve"
#: The oldest timestamp a zip can hold: every entry has it, so equal files give equal wheels.
_EPOCH = (1980, 1, 1, 0, 0, 0)
_SKIPPED_SUFFIXES = frozenset({".pyc", ".pyo"})


def wheel_name(version: str = __version__) -> str:
    return f"{DIST_NAME}-{version}-py3-none-any.whl"


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def _package_files(package: Path) -> list[tuple[str, bytes]]:
    files = []
    for path in sorted(package.rglob("*")):
        relative = path.relative_to(package)
        if path.is_file() and "__pycache__" not in relative.parts and path.suffix not in _SKIPPED_SUFFIXES:
            files.append((f"{DIST_NAME}/{relative.as_posix()}", path.read_bytes()))
    return files


def _source_tree(package: Path) -> Path | None:
    """The checkout the running package is in (`src/twinserve` under a pyproject.toml naming it), if any."""
    root = package.resolve().parent.parent
    pyproject = root / "pyproject.toml"
    if package.resolve() != root / "src" / DIST_NAME or not pyproject.is_file():
        return None
    with pyproject.open("rb") as file:
        project = tomllib.load(file).get("project", {})
    return root if project.get("name") == DIST_NAME else None


def _with_extra(requirement: str, extra: str) -> str:
    name, sep, marker = requirement.partition(";")
    condition = f'extra == "{extra}"'
    return f"{name.strip()}; ({marker.strip()}) and {condition}" if sep else f"{requirement.strip()}; {condition}"


def _metadata_from_pyproject(root: Path) -> tuple[str, str]:
    """(METADATA, entry_points.txt) from a checkout's pyproject.toml: an editable install's metadata is as old as
    the install, while the code (and its dependencies) may have moved on."""
    with (root / "pyproject.toml").open("rb") as file:
        project = tomllib.load(file)["project"]
    if project.get("version") != __version__:
        raise ConfigError(
            f"--out: {root / 'pyproject.toml'} says version {project.get('version')}, the code says {__version__}"
        )
    lines = ["Metadata-Version: 2.1", f"Name: {DIST_NAME}", f"Version: {__version__}"]
    if "description" in project:
        lines.append(f"Summary: {project['description']}")
    if "requires-python" in project:
        lines.append(f"Requires-Python: {project['requires-python']}")
    lines += [f"Requires-Dist: {requirement}" for requirement in project.get("dependencies", [])]
    for extra, requirements in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f"Requires-Dist: {_with_extra(requirement, extra)}" for requirement in requirements]
    scripts = "".join(f"{name} = {target}\n" for name, target in project.get("scripts", {}).items())
    return "\n".join(lines) + "\n", f"[console_scripts]\n{scripts}"


def _metadata(package: Path) -> tuple[str, str]:
    """(METADATA, entry_points.txt): from the checkout's pyproject.toml when running from one, else from the
    installed distribution, which must be the version that is running."""
    root = _source_tree(package)
    if root is not None:
        return _metadata_from_pyproject(root)
    try:
        dist = importlib.metadata.distribution(DIST_NAME)
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(
            "--out: twinserve runs without being installed (no distribution metadata), so it cannot pack itself "
            "into the image's wheel: pip install it (`pip install -e .` in a checkout), or build the wheel with "
            "`python -m build` and use that"
        ) from None
    if dist.version != __version__:
        raise ConfigError(
            f"--out: the installed twinserve distribution is {dist.version} but the code running is {__version__} "
            f"(from {Path(twinserve.__file__).parent}); install the code you mean to deploy"
        )
    # PKG-INFO: the same fields, in an egg-info (a source tree setuptools wrote one into, found first on sys.path)
    metadata = dist.read_text("METADATA") or dist.read_text("PKG-INFO")
    entry_points = dist.read_text("entry_points.txt")
    if not metadata or not entry_points:
        raise ConfigError(f"--out: the installed twinserve {dist.version} has no METADATA or entry_points.txt")
    return metadata, entry_points


def write_wheel(out_dir: Path) -> Path:
    """Write `twinserve-<version>-py3-none-any.whl` of the running package into `out_dir`; returns its path."""
    package = Path(twinserve.__file__).parent
    metadata, entry_points = _metadata(package)
    info = f"{DIST_NAME}-{__version__}.dist-info"
    wheel_meta = f"Wheel-Version: 1.0\nGenerator: twinserve {__version__}\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files = _package_files(package)
    files += [
        (f"{info}/METADATA", metadata.encode()),
        (f"{info}/WHEEL", wheel_meta.encode()),
        (f"{info}/entry_points.txt", entry_points.encode()),
        (f"{info}/top_level.txt", f"{DIST_NAME}\n".encode()),
    ]
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in files) + f"{info}/RECORD,,\n"
    files.append((f"{info}/RECORD", record.encode()))
    path = out_dir / wheel_name()
    partial = path.with_name(path.name + ".partial")
    with zipfile.ZipFile(partial, "w") as wheel:
        for name, data in files:
            entry = zipfile.ZipInfo(name, date_time=_EPOCH)
            entry.external_attr = 0o644 << 16
            wheel.writestr(entry, data, compress_type=zipfile.ZIP_DEFLATED)
    partial.replace(path)
    return path
