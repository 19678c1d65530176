"""Every model and version one server process knows, with its state (Triton's: LOADING, READY, UNLOADING,
UNAVAILABLE): what the fronts serve and the repository index lists.

A model from a MODEL argument that fails stops the server; in a model repository a failing version is
UNAVAILABLE and the others serve. A failure's reason, which clients read, says only what failed and the
exception's type: its text goes to the log, since a model may put a secret in it. `runtimes` maps each name to its
default version's runtime (the highest ready), updated in place so a `Service` holding it sees every change.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from twinserve.config import Config
from twinserve.core.runtime import ModelRuntime, load_runtimes
from twinserve.errors import ConfigError, MissingExtra, ModelNotFound, ModelUnavailable, TwinserveError
from twinserve.repository.layout import ModelFolder, read_model, read_repository
from twinserve.repository.traffic import TrafficPolicy

__all__ = ["FailureKind", "ModelRegistry", "ServedVersion", "State", "failure_reason", "failure_text"]

logger = logging.getLogger("twinserve.repository")

State = Literal["LOADING", "READY", "UNLOADING", "UNAVAILABLE"]
#: What failed: the model folder's twinserve.toml, importing its code, or its `load()`.
FailureKind = Literal["settings", "import", "load"]
_FAILED: dict[FailureKind, str] = {
    "settings": "its twinserve.toml cannot be used",
    "import": "its code failed to import",
    "load": "its load() failed",
}
#: The longest folder name a repository can hold (bytes), where the system does not say.
_NAME_MAX = 255
#: Loads of repository versions in this process, numbering their module names.
_LOADS = itertools.count(1)


@dataclass
class ServedVersion:
    """One version of one model: its runtime (None when it could not be built) and state."""

    name: str
    version: str
    state: State
    reason: str = ""
    runtime: ModelRuntime | None = None

    @property
    def why(self) -> str:
        """Its reason, naming the version (a folder whose settings failed has none): for an error message."""
        return f"version {self.version}: {self.reason}" if self.version else self.reason

    def describe(self) -> dict[str, str]:
        """Its entry in the repository index (Triton's and MLServer's fields)."""
        return {"name": self.name, "version": self.version, "state": self.state, "reason": self.reason}


def failure_text(error: BaseException) -> str:
    """A failure's whole text, for the log: twinserve's message and its private part, or the exception's own."""
    if isinstance(error, TwinserveError):
        return f"{error.message}: {error.private}" if error.private else error.message
    return f"{type(error).__name__}: {error}"


def failure_reason(kind: FailureKind, error: BaseException | None = None) -> str:
    """What a client reads of a failure: its kind, never its text. An import's names the type of what the import
    raised (SyntaxError, ModuleNotFoundError; twinserve's own ModelImportError for a class it did not find): every
    architecture imports in its server process, so each names the same. A `load()` may run in a model worker
    (hybrid), whose exception arrives rebuilt: its type would differ by architecture, so none is named."""
    raised = ""
    if kind == "import" and error is not None:
        raised = f" ({type(error.__cause__ or error).__name__})"
    return f"{_FAILED[kind]}{raised}; the server log has the details"


class ModelRegistry:
    """The models of this process, by name and version (see the module docstring)."""

    def __init__(self, config: Config, strict: bool) -> None:
        self.config = config
        #: MODEL arguments: any failure is the server's. A repository: a failure is that version's.
        self.strict = strict
        self._versions: dict[str, dict[str, ServedVersion]] = {}
        #: Model name -> its default version's runtime (updated in place).
        self.runtimes: dict[str, ModelRuntime] = {}
        #: Model name -> how its unversioned requests are spread over its versions (repository/traffic.py).
        self.traffic: dict[str, TrafficPolicy] = {}
        #: Set once its models are closed (the server stops): a repository poll thread then ends.
        self.closed = False
        #: True while the server's first load runs behind a port that answers already (servers/sync/server.py,
        #: fronts/asgi.py): the server is live, and not ready until it ends (the load and what follows it).
        self.starting = False

    # -- building -------------------------------------------------------------------------------------------
    @classmethod
    def from_config(cls, config: Config) -> ModelRegistry:
        """The models `config` names: its repository's, else its MODEL arguments' (imported, not yet loaded)."""
        if config.model_repository is None:
            return cls.of_runtimes(load_runtimes(config), config)
        registry = cls(config, strict=False)
        for folder in read_repository(config.model_repository):
            registry.add(folder)
        return registry

    @classmethod
    def of_runtimes(cls, runtimes: Mapping[str, ModelRuntime], config: Config) -> ModelRegistry:
        """A strict registry over runtimes built already (MODEL arguments), each its model's only version."""
        registry = cls(config, strict=True)
        for name, runtime in runtimes.items():
            entry = ServedVersion(name, runtime.spec.version, "LOADING", runtime=runtime)
            registry._versions[name] = {entry.version: entry}
        registry._choose_defaults()
        return registry

    def add(self, folder: ModelFolder) -> None:
        """Import every version of a repository model folder (its load comes later); failures are its own."""
        versions: dict[str, ServedVersion] = {}
        if folder.error is not None:
            versions[""] = self._unavailable(folder.name, "", "settings", folder.error)
        for found in folder.versions:
            version = str(found.version)
            try:
                # A module name per load: a reload imports the files afresh, beside the old module still serving.
                module = f"{found.module}_{next(_LOADS)}"
                runtime = ModelRuntime(
                    found.target, self.config, folder.settings, module, name=folder.name, version=version
                )
            except Exception as exc:
                # A per-model setting twinserve refuses is the settings file's; a missing extra is the import's.
                refused = isinstance(exc, ConfigError) and not isinstance(exc, MissingExtra)
                kind: FailureKind = "settings" if refused else "import"
                versions[version] = self._unavailable(folder.name, version, kind, failure_text(exc), exc)
                continue
            versions[version] = ServedVersion(folder.name, version, "LOADING", runtime=runtime)
        self._versions[folder.name] = versions
        self._set_traffic(folder.name, folder.traffic)
        self._choose_defaults()

    def reread(self, name: str) -> ModelFolder:
        """The repository's folder for `name`, read again (ModelNotFound when it has none)."""
        root = self.config.model_repository
        # A name longer than a file name can be (255 bytes on Linux) names no folder: is_dir() would raise.
        if (
            root is None
            or len(name.encode()) > _NAME_MAX
            or name.startswith((".", "_"))
            or "/" in name
            or not (root / name).is_dir()
        ):
            raise ModelNotFound(f"model {name!r} is not in the model repository")
        return read_model(root / name)

    def built(self, folder: ModelFolder) -> dict[str, ServedVersion]:
        """Every version of `folder` imported (LOADING) or UNAVAILABLE, without touching what is served."""
        staged = ModelRegistry(self.config, strict=False)
        staged.add(folder)
        return staged._versions[folder.name]

    def install(
        self, name: str, versions: dict[str, ServedVersion], traffic: TrafficPolicy | None = None
    ) -> list[ServedVersion]:
        """Serve `versions` as `name`'s (loaded already, or UNAVAILABLE), spread by `traffic`, in place of its
        current ones, which are returned: still open, for the caller to drain and close."""
        old = [e for e in self._versions.get(name, {}).values() if e.runtime is not None]
        self._versions[name] = versions
        self._set_traffic(name, traffic)
        self._choose_defaults()
        return old

    def _unavailable(
        self, name: str, version: str, kind: FailureKind, text: str, error: BaseException | None = None
    ) -> ServedVersion:
        label = f"{name!r} version {version}" if version else repr(name)
        logger.error("model %s is unavailable: %s", label, text)
        return ServedVersion(name, version, "UNAVAILABLE", failure_reason(kind, error))

    # -- loading and closing ----------------------------------------------------------------------------------
    def load(self) -> None:
        """Load every version waiting to (sync front: in this process)."""
        self.load_entries(self._waiting())

    def load_entries(self, entries: list[ServedVersion]) -> None:
        """Load these versions: each READY, or UNAVAILABLE with the reason."""
        for entry in entries:
            assert entry.runtime is not None
            try:
                entry.runtime.load()
            except Exception as exc:
                self._failed(entry, exc)
            else:
                entry.state = "READY"
        self._choose_defaults()

    async def aload(self) -> None:
        """Load every version waiting to (async fronts)."""
        await self.aload_entries(self._waiting())

    async def aload_entries(self, entries: list[ServedVersion]) -> None:
        """`load_entries` for the event loop."""
        for entry in entries:
            assert entry.runtime is not None
            try:
                await entry.runtime.aload()
            except Exception as exc:
                self._failed(entry, exc)
            else:
                entry.state = "READY"
        self._choose_defaults()

    def _waiting(self) -> list[ServedVersion]:
        return [e for e in self.entries() if e.state == "LOADING" and e.runtime is not None]

    def _failed(self, entry: ServedVersion, exc: Exception) -> None:
        if self.strict:  # the server's failure: it stops; requests waiting for the model are answered 503 at once
            entry.state, entry.reason = "UNAVAILABLE", failure_reason("load")
            self._choose_defaults()
            raise exc
        runtime, entry.runtime = entry.runtime, None
        if runtime is not None:
            runtime.close()
        entry.state, entry.reason = "UNAVAILABLE", failure_reason("load")
        self._choose_defaults()  # requests already come (the server answers while it loads): not this one
        logger.error("model %r version %s is unavailable: %s", entry.name, entry.version, failure_text(exc))

    def close(self) -> None:
        self.closed = True
        for entry in self.entries():
            if entry.runtime is not None:
                entry.runtime.close()

    async def aclose(self) -> None:
        self.closed = True
        for entry in self.entries():
            if entry.runtime is not None:
                await entry.runtime.aclose()

    # -- lookup -------------------------------------------------------------------------------------------
    def entries(self) -> Iterator[ServedVersion]:
        for versions in self._versions.values():
            yield from versions.values()

    def runtime(self, name: str, version: str | None = None) -> ModelRuntime:
        """The runtime of `name` (its default version when `version` is None); 404 for an unknown model or
        version, 503 model_unavailable (with the reason) for one that failed or was unloaded."""
        versions = self._versions.get(name)
        if versions is None:
            raise ModelNotFound(f"model {name!r} is not served here; GET /v1/models lists the served models")
        if version is None:
            runtime = self.runtimes.get(name)
            if runtime is not None:
                return runtime
            reasons = "; ".join(e.why for e in versions.values() if e.reason)
            raise ModelUnavailable(f"model {name!r} is unavailable: {reasons or 'no version is loaded'}")
        entry = versions.get(version)
        if entry is None:
            served = ", ".join(v for v in versions if v)
            raise ModelNotFound(f"model {name!r} has no version {version!r}; it serves version(s) {served or 'none'}")
        if entry.runtime is None or entry.state in ("UNAVAILABLE", "UNLOADING"):
            raise ModelUnavailable(f"model {name!r} version {version} is unavailable: {entry.reason or entry.state}")
        return entry.runtime

    def routed(self, name: str, key: str | None) -> ModelRuntime:
        """The runtime that answers an unversioned request for `name` with sticky `key`: by its traffic split
        among the versions ready now, else (no split, none of its versions ready) the default."""
        policy = self.traffic.get(name)
        if policy is not None and policy.split:
            ready = {v: e.runtime for v, e in self._versions.get(name, {}).items() if e.state == "READY" and e.runtime}
            version = policy.primary(key, ready)
            if version is not None:
                return ready[version]
        return self.runtime(name)

    def shadow_of(self, name: str, primary: str, key: str | None) -> ModelRuntime | None:
        """The version that computes this request again for comparison (its traffic's shadow), if it is ready
        and not the one answering; else None."""
        policy = self.traffic.get(name)
        version = policy.shadowed(key) if policy is not None else None
        entry = self._versions.get(name, {}).get(version) if version is not None and version != primary else None
        return entry.runtime if entry is not None and entry.state == "READY" else None

    def unsplit_default(self, name: str) -> str | None:
        """Why `name`'s default version gets no unversioned request, when its traffic split gives it no weight (a
        version loaded as the new default under an older split, say); else None."""
        policy, runtime = self.traffic.get(name), self.runtimes.get(name)
        if policy is None or not policy.split or runtime is None or policy.split.get(runtime.spec.version, 0) > 0:
            return None
        sent = ", ".join(version for version, weight in policy.split.items() if weight > 0)
        return (
            f"model {name!r}: its default version {runtime.spec.version} gets no unversioned request; the traffic "
            f"split sends them to version {sent}"
        )

    def set_traffic(self, name: str, traffic: TrafficPolicy | None) -> None:
        """Spread `name`'s requests by `traffic` from now on (None: its default takes them); ModelNotFound for a
        model this registry does not know, ValueError for a version it does not serve."""
        if name not in self._versions:
            raise ModelNotFound(f"model {name!r} is not in the model repository")
        if traffic is not None:
            traffic.check([v for v in self._versions[name] if v])
        self._set_traffic(name, traffic)

    def _set_traffic(self, name: str, traffic: TrafficPolicy | None) -> None:
        if traffic is None:
            self.traffic.pop(name, None)
        else:
            self.traffic[name] = traffic

    def knows(self, name: str) -> bool:
        """Whether `name` is a model of this registry (served, or unavailable)."""
        return name in self._versions

    def versions_of(self, name: str) -> list[ServedVersion]:
        return sorted(self._versions.get(name, {}).values(), key=lambda e: _number(e.version))

    def index(self) -> list[dict[str, str]]:
        """The repository index: every model and version with its state and reason, by name then version."""
        return [e.describe() for name in sorted(self._versions) for e in self.versions_of(name)]

    def _choose_defaults(self) -> None:
        """Each model's default: the highest ready version, else (while starting) the highest loading one."""
        for name, versions in self._versions.items():
            ranked = sorted((e for e in versions.values() if e.runtime is not None), key=lambda e: _number(e.version))
            ready = [e for e in ranked if e.state == "READY"]
            candidates = ready or [e for e in ranked if e.state == "LOADING"]
            chosen = candidates[-1] if candidates else None
            if chosen is None or chosen.runtime is None:
                self.runtimes.pop(name, None)
            else:
                self.runtimes[name] = chosen.runtime
        for name in list(self.runtimes):
            if name not in self._versions:
                del self.runtimes[name]


def _number(version: str) -> tuple[int, str]:
    return (int(version), version) if version.isdigit() else (-1, version)
