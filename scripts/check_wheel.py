"""Check what `python -m build` made: the wheel a user installs and the sdist it is rebuilt from.

    python scripts/check_wheel.py dist/twinserve-0.1.0-py3-none-any.whl [dist/twinserve-0.1.0.tar.gz]

The wheel must hold the package with its data (py.typed, the built-in examples), no tests, and declare the
`twinserve` console script; the sdist must hold src/ and pyproject.toml. Prints one line per problem, exits 1 if any.
"""

from __future__ import annotations

import configparser
import fnmatch
import sys
import tarfile
import zipfile
from pathlib import Path

#: Globs every wheel must match at least once.
WHEEL_NEEDS = (
    "twinserve/__init__.py",
    "twinserve/py.typed",
    "twinserve/examples/__init__.py",
    "twinserve/examples/tabular.py",
    "twinserve/examples/embed.py",
    "twinserve/examples/*.py",
)
SCRIPT = "twinserve"
ENTRY_POINT = "twinserve.cli:main"


def check_wheel(path: Path, source: Path | None = None) -> list[str]:
    problems: list[str] = []
    with zipfile.ZipFile(path) as wheel:
        names = wheel.namelist()
        for pattern in WHEEL_NEEDS:
            if not fnmatch.filter(names, pattern):
                problems.append(f"{path.name}: nothing matches {pattern}")
        if source is not None:  # every module of the source tree (the examples among them) made it in
            for module in sorted((source / "twinserve").rglob("*.py")):
                name = module.relative_to(source).as_posix()
                if name not in names:
                    problems.append(f"{path.name}: {name} is missing")
        stray = [n for n in names if n.split("/")[0] in {"tests", "test", "benchmarks", "scripts"} or "/tests/" in n]
        problems += [f"{path.name}: {n} should not be in the wheel" for n in stray]
        entry_points = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        if len(entry_points) != 1:
            problems.append(f"{path.name}: expected one dist-info/entry_points.txt, found {entry_points}")
        else:
            parser = configparser.ConfigParser()
            parser.read_string(wheel.read(entry_points[0]).decode())
            declared = parser.get("console_scripts", SCRIPT, fallback=None)
            if declared is None or declared.strip() != ENTRY_POINT:
                problems.append(f"{path.name}: console script {SCRIPT} = {declared!r}, expected {ENTRY_POINT!r}")
    return problems


def check_sdist(path: Path) -> list[str]:
    with tarfile.open(path) as sdist:
        names = sdist.getnames()
    roots = {n.split("/")[0] for n in names}
    if len(roots) != 1:
        return [f"{path.name}: expected one top folder, found {sorted(roots)}"]
    (root,) = roots
    needs: tuple[str, ...] = ("pyproject.toml", "README.md", "PKG-INFO", "src/twinserve/__init__.py")
    needs += ("src/twinserve/py.typed", "src/twinserve/examples/tabular.py")
    return [f"{path.name}: {root}/{need} is missing" for need in needs if f"{root}/{need}" not in names]


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print(__doc__, file=sys.stderr)
        return 2
    source = Path(__file__).resolve().parent.parent / "src"
    problems = check_wheel(Path(argv[0]), source if source.is_dir() else None)
    if len(argv) == 2:
        problems += check_sdist(Path(argv[1]))
    for problem in problems:
        print(f"check_wheel: {problem}", file=sys.stderr)
    if not problems:
        print(f"check_wheel: {', '.join(Path(a).name for a in argv)}: ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
