"""What the image's build context carries: the model modules the command names, and the files their models read.

`twinserve k8s --out DIR` lays each at its path relative to the working directory, which is its path in DIR and
under the image's WORKDIR: a model file with the files its class declares in `files` (read from the source, never
imported) or else the files beside it (not subfolders, so a model at a project's top does not sweep the project
in); an uninstalled package whole; a model repository as REPOSITORY_CONTEXT; nothing for an installed package.
Bytecode, hidden files (`.git`, `.env`: secrets), virtualenvs and the --out folder are never carried; each skip
is reported with its reason. The context also lists the files `deploy.needed_extras` reads.
"""

from __future__ import annotations

import ast
import importlib.util
import posixpath
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from twinserve.config import Config
from twinserve.deploy.k8s import REPOSITORY_PATH
from twinserve.deploy.wheel import DIST_NAME
from twinserve.errors import ConfigError
from twinserve.repository.layout import SETTINGS_FILE

__all__ = [
    "REPOSITORY_CONTEXT",
    "WORKDIR",
    "BuildContext",
    "Carried",
    "Skipped",
    "copy_context",
    "declared_files",
    "discover",
    "parse_source",
]

WORKDIR = "/app"
#: The model repository's folder in the build context.
REPOSITORY_CONTEXT = "model-repository"
#: What `twinserve k8s --out` writes into its folder: never carried when a model's folder is that folder.
_OUTPUTS = frozenset(
    {"Dockerfile", "kubernetes.yaml", "kserve.yaml", "grafana-dashboard.json", "prometheus-rules.yaml"}
)
_BYTECODE = frozenset({".pyc", ".pyo"})
#: How many of a folder's data files `describe` names before it only counts them.
_NAMED = 5


@dataclass(frozen=True)
class Carried:
    """One file or folder in the context at `path` (relative: the same path under WORKDIR), copied from `source`.

    `files` are the files it holds, as paths in the context (itself, for a file); `why` says which model needs it.
    """

    path: PurePosixPath
    source: Path
    why: str
    files: tuple[PurePosixPath, ...]
    size: int
    is_dir: bool = False

    def local(self, file: PurePosixPath) -> Path:
        """Where one of `files` is on this machine."""
        return self.source / file.relative_to(self.path) if self.is_dir else self.source

    def describe(self) -> str:
        if not self.is_dir:
            return f"{self.path} ({_size(self.size)}): {self.why}"
        count = f"{len(self.files)} file{'s' if len(self.files) != 1 else ''}"
        # The files a model reads, by their paths inside the folder: not its modules nor a repository's settings.
        data = [str(f.relative_to(self.path)) for f in self.files if f.suffix != ".py" and f.name != SETTINGS_FILE]
        held = f"; holds {', '.join(data[:_NAMED])}" if data else ""
        if len(data) > _NAMED:
            held += f" and {len(data) - _NAMED} more"
        return f"{self.path}/ ({count}, {_size(self.size)}): {self.why}{held}"


@dataclass(frozen=True)
class Skipped:
    """A path found beside or inside a carried one and left out, and why."""

    path: str
    why: str


@dataclass
class BuildContext:
    """What `discover` found: the carried paths, the skipped ones, and the files that say which extras are needed."""

    carried: list[Carried] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    #: (file on this machine, the name to report it by): read for the extras the image needs.
    scanned: list[tuple[Path, str]] = field(default_factory=list)
    #: Lines for the user that are neither carried nor skipped paths (an installed package, say).
    notes: list[str] = field(default_factory=list)

    @property
    def repository(self) -> Carried | None:
        """The model repository, when the image holds it."""
        return next((c for c in self.carried if str(c.path) == REPOSITORY_CONTEXT), None)

    def describe(self) -> list[str]:
        """One line per carried path, skipped path and note, as `twinserve k8s --out` prints them."""
        return [
            *(f"carried {c.describe()}" for c in self.carried),
            *(f"skipped {s.path}: {s.why}" for s in self.skipped),
            *(f"note: {note}" for note in self.notes),
        ]


def discover(config: Config, cwd: Path, out_dir: Path, repository_in_image: bool = True) -> BuildContext:
    """What the context for `config`'s models carries; ConfigError (before anything is written) for a model file the
    image cannot hold at the same path, or a declared file that is not there."""
    finder = _Finder(cwd, out_dir)
    if config.model_repository is not None:  # `models` then holds Config's default, which the repository replaces
        finder.repository(config.model_repository, repository_in_image)
    else:
        for target in config.models:
            finder.model(target)
    return finder.context()


def copy_context(context: BuildContext, out_dir: Path) -> None:
    """Copy what `context` carries into `out_dir`; a folder afresh, so that nothing stale rides along with it."""
    for carried in context.carried:
        target = out_dir / carried.path
        if carried.source.resolve() == target.resolve():
            continue  # the context already is its home
        if carried.is_dir:
            if target.exists():
                shutil.rmtree(target)
            target.mkdir(parents=True)  # even empty: a COPY of a folder the context lacks fails the build
        for file in carried.files:
            (out_dir / file).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(carried.local(file), out_dir / file)


def parse_source(path: Path) -> ast.Module | None:
    """The syntax tree of a Python file, or None when it does not parse (it is then neither scanned nor read)."""
    try:
        return ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return None


def declared_files(tree: ast.Module, class_name: str) -> list[str] | None:
    """The `files` the class `class_name` declares in its body (a literal list of strings), or None if it declares
    none. ConfigError when `files` is not such a literal: it is read from the source, never run."""
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or node.name != class_name:
            continue
        for statement in node.body:
            value = _assigned(statement, "files")
            if value is None:
                continue
            try:
                files = ast.literal_eval(value)
            except ValueError:
                files = None
            if not isinstance(files, list | tuple) or not all(isinstance(f, str) and f for f in files):
                raise ConfigError(
                    f"--out: {class_name}.files must be a literal list of relative paths, e.g. "
                    f'["weights.skops", "tokenizer/"]: it is read from the source, without importing the model'
                )
            return list(files)
    return None


def _assigned(statement: ast.stmt, name: str) -> ast.expr | None:
    if isinstance(statement, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in statement.targets):
        return statement.value
    if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) and statement.target.id == name:
        return statement.value
    return None


def _size(size: int) -> str:
    if size < 1000:
        return f"{size} B"
    scaled = float(size)
    for unit in ("kB", "MB", "GB"):
        scaled /= 1000
        if scaled < 1000 or unit == "GB":
            break
    return f"{scaled:.1f} {unit}"


class _Finder:
    """Collects what each model needs, relative to `cwd`, and what it skipped on the way."""

    def __init__(self, cwd: Path, out_dir: Path) -> None:
        self.cwd = cwd
        self.out_dir = (cwd / out_dir).resolve()
        self.carried: dict[PurePosixPath, Carried] = {}
        self.skipped: dict[str, Skipped] = {}
        self.scanned: dict[Path, str] = {}
        self.notes: list[str] = []

    def context(self) -> BuildContext:
        folders = [c.path for c in self.carried.values() if c.is_dir]
        # In the order found (a model's module before the files it reads); a file in a carried folder rides with it.
        carried = [c for path, c in self.carried.items() if not any(f in path.parents for f in folders)]
        return BuildContext(carried, list(self.skipped.values()), list(self.scanned.items()), self.notes)

    # -- the three kinds of MODEL -------------------------------------------------------------------------------

    def model(self, target: str) -> None:
        module, _, class_name = target.rpartition(":")
        if module.endswith(".py"):
            self.module_file(self.relative(module, f"the model file {module!r}"), target, class_name)
            return
        top = module.split(".")[0]
        if (self.cwd / top).is_dir():
            self.package(PurePosixPath(top), module, target, class_name)
        elif (self.cwd / f"{top}.py").is_file():
            self.module_file(PurePosixPath(f"{top}.py"), target, class_name)
        else:
            self.installed(module, target)

    def module_file(self, path: PurePosixPath, target: str, class_name: str) -> None:
        """`path/file.py:Class`: the module, and its declared files or else the files beside it."""
        source = self.cwd / path
        if not source.is_file():
            raise ConfigError(f"--out: no such model file: {path}")
        self.file(path, f"the module of {target}")
        declared = self.declared(source, class_name)
        if declared is None:
            self.beside(path)
        else:
            self.declared_paths(path.parent, declared, class_name)

    def package(self, top: PurePosixPath, module: str, target: str, class_name: str) -> None:
        """`pkg.mod:Class` with `pkg/` in the working directory: the whole package, and declared files outside it."""
        self.folder(top, f"the package of {target}")
        parts = module.split(".")
        for candidate in (PurePosixPath(*parts).with_suffix(".py"), PurePosixPath(*parts, "__init__.py")):
            if (self.cwd / candidate).is_file():
                declared = self.declared(self.cwd / candidate, class_name)
                if declared is not None:
                    self.declared_paths(candidate.parent, declared, class_name)
                return

    def installed(self, module: str, target: str) -> None:
        """An installed package: twinserve's own is in the wheel (its source still says which extras it needs)."""
        if module.split(".")[0] != DIST_NAME:
            self.notes.append(
                f"{target} is not in the working directory: not carried (if it is an installed package, the image "
                "must install it too: add a RUN pip install line)"
            )
            return
        try:
            spec = importlib.util.find_spec(module)
        except ImportError:
            spec = None
        if spec is not None and spec.origin is not None and spec.origin.endswith(".py"):
            self.scanned[Path(spec.origin)] = module

    def repository(self, repository: Path, in_image: bool) -> None:
        """The model repository, whole; its files are read for extras even when a volume holds it."""
        skipped = dict(self.skipped)
        files = list(self.walk(repository, PurePosixPath(REPOSITORY_CONTEXT), str(repository)))
        for local, _ in files:
            self.scanned[local] = str(local)
        if not in_image:
            self.skipped = skipped  # nothing of it is carried, so nothing of it is skipped either
            self.notes.append(
                f"the model repository {repository} is not carried: --repository-volume mounts it at "
                f"{REPOSITORY_PATH}; its files were read for the extras the image needs"
            )
        else:
            self.carried[PurePosixPath(REPOSITORY_CONTEXT)] = Carried(
                PurePosixPath(REPOSITORY_CONTEXT),
                repository,
                f"the model repository {repository}/, at {REPOSITORY_PATH} in the image",
                tuple(path for _, path in files),
                sum(local.stat().st_size for local, _ in files),
                is_dir=True,
            )

    # -- files, folders and what to skip ------------------------------------------------------------------------

    def relative(self, name: str, what: str, parents: bool = False) -> PurePosixPath:
        """`name` as a path relative to the working directory and inside it, which the image holds at the same
        path under WORKDIR; ConfigError otherwise. With `parents`, `..` may appear (a declared file's path from
        its module's folder) as long as the path stays inside."""
        given = PurePosixPath(Path(name).as_posix())
        normal = posixpath.normpath(given.as_posix())
        outside = given.is_absolute() or normal.split("/")[0] == ".."
        if outside or (not parents and ".." in given.parts):
            raise ConfigError(
                f"--out: give {what} relative to the current folder and inside it, so the image can hold it at the "
                f"same path under {WORKDIR}"
            )
        return PurePosixPath(normal)

    def declared(self, source: Path, class_name: str) -> list[str] | None:
        tree = parse_source(source)
        return None if tree is None else declared_files(tree, class_name.split(".")[0])

    def declared_paths(self, folder: PurePosixPath, declared: list[str], class_name: str) -> None:
        for name in declared:
            path = self.relative(str(folder / name), f"{class_name}.files' {name!r}", parents=True)
            if (self.cwd / path).is_dir():
                self.folder(path, f"declared in {class_name}.files")
            elif (self.cwd / path).is_file():
                self.file(path, f"declared in {class_name}.files")
            else:
                raise ConfigError(f"--out: {class_name}.files names {name!r}, and there is no {path}")

    def beside(self, module: PurePosixPath) -> None:
        """Every file beside `module`; its folder's subfolders are named as skipped."""
        folder = self.cwd / module.parent
        for entry in sorted(folder.iterdir()):
            path = module.parent / entry.name
            if path == module:
                continue
            why = self.skip_reason(entry) or (
                "written by twinserve k8s --out" if folder.resolve() == self.out_dir and _output(entry.name) else None
            )
            if why is None and entry.is_dir():
                why = f"a folder beside {module}: name it in the model's files to carry it"
            if why is not None:
                self.skipped.setdefault(str(path), Skipped(str(path) + ("/" if entry.is_dir() else ""), why))
            else:
                self.file(path, f"beside {module}")

    def file(self, path: PurePosixPath, why: str) -> None:
        source = self.cwd / path
        self.scanned[source] = str(path)
        if path not in self.carried:
            self.carried[path] = Carried(path, source, why, (path,), source.stat().st_size)

    def folder(self, path: PurePosixPath, why: str) -> None:
        source = self.cwd / path
        files = list(self.walk(source, path, str(path)))
        for local, shown in files:
            self.scanned[local] = str(shown)
        if path not in self.carried:
            sizes = sum(local.stat().st_size for local, _ in files)
            self.carried[path] = Carried(path, source, why, tuple(p for _, p in files), sizes, is_dir=True)

    def walk(self, folder: Path, path: PurePosixPath, shown: str) -> Iterator[tuple[Path, PurePosixPath]]:
        """The files under `folder` (as (local file, path in the context)) that are not skipped."""
        for entry in sorted(folder.iterdir()):
            why = self.skip_reason(entry)
            if why is not None:
                name = f"{shown}/{entry.name}" + ("/" if entry.is_dir() else "")
                self.skipped.setdefault(name, Skipped(name, why))
            elif entry.is_dir():
                yield from self.walk(entry, path / entry.name, f"{shown}/{entry.name}")
            else:
                yield entry, path / entry.name

    def skip_reason(self, entry: Path) -> str | None:
        if entry.resolve() == self.out_dir:
            return "the --out folder itself"
        if entry.name == "__pycache__" or entry.suffix in _BYTECODE:
            return "bytecode"
        if entry.name.startswith("."):
            return "hidden"
        if entry.is_dir():
            return "a virtualenv" if (entry / "pyvenv.cfg").is_file() else None
        return None if entry.is_file() else "not a regular file"


def _output(name: str) -> bool:
    return (
        name in _OUTPUTS or name == REPOSITORY_CONTEXT or (name.startswith(f"{DIST_NAME}-") and name.endswith(".whl"))
    )
