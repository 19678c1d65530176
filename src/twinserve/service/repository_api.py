"""The repository API's handlers (Triton's and MLServer's): the index, and load and unload for the admin key; a
model's traffic split and shadow, read by any key and set by the admin key (repository/traffic.py).

Transport-free like the rest of `Service`: each front calls `index`, or `load` / `unload` from its own way of
waiting (the sync front in the request's thread, the async fronts as coroutines: `aload`, `aunload`).
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from twinserve.config import Config
from twinserve.errors import Forbidden, MalformedRequest, ModelControlOff, ModelNotFound, ModelUnavailable
from twinserve.protocol.v1 import dumps
from twinserve.repository import ModelRegistry
from twinserve.repository.control import ModelControl
from twinserve.repository.desired import DesiredState, RepositoryFollower
from twinserve.repository.poll import RepositoryPoller
from twinserve.repository.traffic import TrafficPolicy
from twinserve.service.auth import key_id
from twinserve.service.reply import Reply

__all__ = ["RepositoryApi"]

logger = logging.getLogger("twinserve.repository")


class RepositoryApi:
    """The repository routes over one process's registry, and what keeps that process's models in step."""

    def __init__(self, registry: ModelRegistry, config: Config, auth_on: bool) -> None:
        self.registry = registry
        self.config = config
        self._auth_on = auth_on
        self._admin = key_id(config.admin_api_key) if config.admin_api_key is not None else None
        #: Loads and unloads on request (None: `--model-control none` or `poll`, or MODEL arguments).
        self._control: ModelControl | None = None
        #: Several server processes' shared record of explicit loads and unloads (None: one process).
        self._desired: DesiredState | None = None
        #: What keeps this process's models in step, started once they are loaded: the folder's poll
        #: (`--model-control poll`), or the other processes' explicit changes (repository/desired.py).
        self.watch: RepositoryPoller | RepositoryFollower | None = None
        #: Every load and unload of this process's repository models goes through this one (None: MODEL arguments):
        #: the API's, the poll's, the other processes' and the loads on demand (repository/residency.py).
        self.changes = ModelControl(registry) if config.model_repository is not None else None
        if config.model_repository is None or self.changes is None or config.model_control == "none":
            return
        control = self.changes
        if config.model_control == "poll":
            self.watch = RepositoryPoller(control, config.model_repository, config.repository_poll_s)
            return
        self._control = control
        self._desired = DesiredState.attach() if config.effective_workers > 1 else None
        if self._desired is not None:
            self.watch = RepositoryFollower(control, self._desired)

    def index(self) -> Reply:
        """Every model and version, its state and why (Triton's and MLServer's index)."""
        return Reply(200, dumps(self.registry.index()))

    def load(self, key: str | None, model: str) -> Reply:
        return self._changed(self.control(key).load(model), model, loaded=True)

    def unload(self, key: str | None, model: str) -> Reply:
        return self._changed(self.control(key).unload(model), model, loaded=False)

    async def aload(self, key: str | None, model: str) -> Reply:
        return self._changed(await self.control(key).aload(model), model, loaded=True)

    async def aunload(self, key: str | None, model: str) -> Reply:
        return self._changed(await self.control(key).aunload(model), model, loaded=False)

    def traffic(self, model: str) -> Reply:
        """`model`'s traffic split, sticky header and shadow (all empty: its default version takes every request)."""
        if not self.registry.knows(model):
            raise ModelNotFound(f"model {model!r} is not served here")
        policy = self.registry.traffic.get(model, TrafficPolicy())
        return Reply(200, dumps({"name": model, "traffic": policy.describe()}))

    def set_traffic(self, key: str | None, model: str, body: bytes) -> Reply:
        """Change the parts of `model`'s traffic policy the body names (the `[traffic]` table as JSON; a part set to
        null is removed, a part left out is kept), in every server process; the answer is the whole policy now in
        force. The admin key and `--model-control explicit`, as for load and unload."""
        control = self.control(key, "changing a model's traffic")
        try:
            described = control.set_traffic(model, _json_object(body))
        except ValueError as exc:
            raise MalformedRequest(str(exc)) from None
        if self._desired is not None:  # the server's other processes follow
            self._desired.publish_traffic(model, described)
        return Reply(200, dumps({"name": model, "traffic": described, **self._warnings(model)}))

    def control(self, key: str | None, action: str = "loading and unloading models") -> ModelControl:
        """The model control, for a request whose API key id is `key`: 403 unless it is the admin key (when keys
        are on), 400 unless `--model-control explicit`."""
        if self._auth_on and (self._admin is None or key != self._admin):
            raise Forbidden(f"{action} needs the admin API key (--admin-api-key)")
        if self._control is None:
            raise ModelControlOff(
                f"this server loads and unloads models by itself (--model-control {self.config.model_control}); "
                "serve with --model-repository DIR --model-control explicit to load, unload and split traffic on "
                "request"
            )
        return self._control

    def _changed(self, entries: list[dict[str, str]], model: str, loaded: bool) -> Reply:
        """The answer to a load or unload: the model's versions and their states (503 when none loaded)."""
        if self._desired is not None:  # the server's other processes follow
            self._desired.publish(model, loaded)
        if loaded and not any(entry["state"] == "READY" for entry in entries):
            reasons = "; ".join(
                f"version {e['version']}: {e['reason']}" if e["version"] else e["reason"]
                for e in entries
                if e["reason"]
            )
            raise ModelUnavailable(f"model {model!r} did not load: {reasons or 'no version to load'}")
        return Reply(200, dumps({"name": model, "versions": entries, **self._warnings(model)}))

    def _warnings(self, model: str) -> dict[str, list[str]]:
        """`{"warnings": [...]}` where the change leaves `model`'s default version without unversioned traffic
        (also logged); else nothing."""
        warning = self.registry.unsplit_default(model)
        if warning is None:
            return {}
        logger.warning(warning)
        return {"warnings": [warning]}


def _json_object(body: bytes) -> Any:
    try:
        # orjson refuses nesting past 1,024 levels (ValueError) where json's recursion would raise RecursionError.
        table = orjson.loads(body or b"{}")
    except ValueError as exc:
        raise MalformedRequest(f"the body is not valid JSON: {exc}") from None
    if not isinstance(table, dict):
        raise MalformedRequest('the body must be a JSON object: {"split": {...}, "sticky_header": ..., "shadow": ...}')
    return table
