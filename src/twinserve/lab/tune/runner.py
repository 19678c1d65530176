"""`twinserve tune`'s driver: measure the model in-process, then run each probe the policy asks for against a real
server, open-loop Poisson load from the lab's own generator, until the policy decides or the budget is spent.

The policy (`search.next_step`) and the space (`space.search_space`) are pure; this module is the part
that starts servers (`TwinserveServer`, `--port 0`), drives them (`run_level_sync`, latency from each request's
scheduled send time) and reads their process tree's memory (`TreeSampler`). A server is kept while consecutive
probes are for the same candidate (a capacity search runs several rates on one server), and stopped otherwise.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from twinserve.lab.ceiling import measure_in_subprocess, thread_caps
from twinserve.lab.loadgen import LoadSpec, run_level_sync
from twinserve.lab.probe import TreeSampler, scrape, settle
from twinserve.lab.results import Ceiling
from twinserve.lab.servers import ServerFailed, TwinserveServer
from twinserve.lab.tune.search import Decision, Goal, Plan, Probe, ProbeResult, next_step, plan_search, warmup_s
from twinserve.lab.tune.space import ModelFacts, Space, search_space
from twinserve.lab.tune.subject import TuneSubject, probe_args, server_flags
from twinserve.lab.variants import Variant

__all__ = [
    "CEILING_SIZES",
    "ProbeServers",
    "TuneOutcome",
    "TuneRequest",
    "measure_facts",
    "measure_probe",
    "model_bodies",
    "run_tune",
]

#: Batch sizes the in-process curve is measured at.
CEILING_SIZES = [1, 8, 32]
#: Kept back from the budget for what the search's clock does not see: stopping the last probe's server (SIGTERM,
#: drain, exit), and probes and server starts that take a little longer than estimated; without it a search that
#: used its whole budget ended past it. A second, or a hundredth of the budget where that is more.
STOP_S = 1.0
STOP_SHARE = 0.01
#: A fresh server answers its first second or so slower than the rest, so a first probe could miss the objective
#: at a rate the same server then met. A probe on a server just started is warmed this much longer (its cost is
#: counted in the start's).
FRESH_WARMUP_S = 1.0
#: Server start-up plus its first probe's longer warm-up is unknown before the first probe: assume this
#: much per server started.
DEFAULT_OVERHEAD_S = 3.0 + FRESH_WARMUP_S


@dataclass(frozen=True)
class TuneRequest:
    """What `twinserve tune MODEL ...` was asked."""

    model: str
    goal: Goal
    budget_s: float
    bodies: Sequence[bytes]
    archs: Sequence[str] = ("sync", "async", "hybrid")
    repeats: int = 3
    min_probe_s: float = 1.0
    max_probe_s: float = 10.0
    log_dir: Path | None = None
    ready_timeout_s: float = 120.0
    ceiling_budget_s: float = 1.0
    #: The model resolved (`subject.subject`): with settings of its own, probes go through a scratch
    #: repository and its own settings are a candidate. None: `model` served with flags, as a plain MODEL.
    subject: TuneSubject | None = None


@dataclass
class TuneOutcome:
    """Everything a tune run learned: the facts, the space, the plan, every probe, the decision."""

    request: TuneRequest
    facts: ModelFacts
    space: Space
    plan: Plan
    decision: Decision
    results: list[ProbeResult] = field(default_factory=list)
    model_name: str = ""
    elapsed_s: float = 0.0


#: Told of each probe as it finishes: (its number, the result, seconds spent so far, the plan).
OnProbe = Callable[[int, ProbeResult, float, Plan], None]


def model_bodies(model: str) -> tuple[str, list[bytes]]:
    """The model's name and one V1 request body per example (as `twinserve locustfile` builds them; none
    when it has no examples)."""
    import orjson

    from twinserve.model import ModelSpec, import_model
    from twinserve.protocol.v1 import json_default

    spec = ModelSpec(import_model(model)())
    examples = spec.examples() or []
    return spec.name, [orjson.dumps({"instances": [e]}, default=json_default) for e in examples]


class ProbeServers:
    """At most one probe server at a time, kept while the candidate stays the same.

    Each server started writes its own log in the request's `log_dir`, numbered in order of starting and named
    by candidate and stage (`03-async_workers-2_..._rung1.log`): a candidate started again at a later rung gets
    a new file, never the last one's."""

    def __init__(self, request: TuneRequest, scratch: Path | None = None) -> None:
        self._request = request
        self._scratch = scratch  # where scratch repositories go (a model with settings of its own)
        self._label: str | None = None
        self._server: TwinserveServer | None = None
        self._starts = 0
        #: pid -> role ("server", "model_worker") of the running server's processes, from its /metrics.
        self.roles: dict[int, str] = {}
        #: The log of the server last started (None without a `log_dir`).
        self.log: Path | None = None

    def running(self, variant: Variant) -> bool:
        """Whether `variant`'s server is the one up (a probe on it follows another)."""
        return self._label == variant.label and self._server is not None

    def _log_path(self, variant: Variant, stage: str) -> Path | None:
        self._starts += 1
        if self._request.log_dir is None:
            return None
        name = variant.label.replace(" ", "_").replace("=", "-")
        return self._request.log_dir / f"{self._starts:02d}-{name}-{stage}.log"

    def get(self, variant: Variant, stage: str = "") -> TwinserveServer:
        """`variant`'s server: the running one, or a new one started for `stage` (which names its log)."""
        if self.running(variant):
            assert self._server is not None
            return self._server
        self.close()
        log = self.log = self._log_path(variant, stage)
        subject = self._request.subject
        if subject is not None and subject.per_model:
            if self._scratch is None:
                raise ValueError("a model with settings of its own is probed from a scratch repository: pass scratch")
            models, flags = probe_args(subject, variant, self._scratch)
        else:
            models, flags = [self._request.model], server_flags(variant)
        server = TwinserveServer(
            models, variant.arch, *flags, log_path=log, ready_timeout=self._request.ready_timeout_s
        )
        self._label = variant.label
        self._server = server.start()  # ServerFailed: nothing is left running
        snapshot = scrape(server.url)
        self.roles = snapshot.roles if snapshot is not None else {}
        return server

    def close(self) -> None:
        if self._server is not None:
            with contextlib.suppress(ServerFailed, OSError):
                self._server.stop()
        self._server, self._label, self.roles = None, None, {}


def measure_probe(servers: ProbeServers, probe: Probe, name: str, request: TuneRequest, seed: int) -> ProbeResult:
    """Run one probe on the candidate's server (started if it is not the one running); a server that does not
    start is a failed probe, not an error."""
    started = time.monotonic()
    reused = servers.running(probe.candidate)
    try:
        server = servers.get(probe.candidate, probe.stage)
    except ServerFailed as exc:
        log = None if servers.log is None else str(servers.log)
        servers.close()
        reason = str(exc).splitlines()[0]
        return ProbeResult(probe, 0, 0, 0.0, 0.0, None, None, None, 0.0, time.monotonic() - started, reason, log=log)
    # Past a few SLOs a request has missed it anyway: the probe need not wait longer for it.
    timeout_s = max(1.0, 10 * request.goal.slo_p95_ms / 1000)
    if reused:  # the last probe's backlog (an overloaded one's) drains before this one counts
        settle(server.url, deadline_s=2 * timeout_s)
    spec = LoadSpec(
        url=f"{server.url}/v1/models/{name}:predict",
        bodies=list(request.bodies),
        duration_s=probe.seconds,
        warmup_s=warmup_s(probe.seconds) + (0.0 if reused else FRESH_WARMUP_S),
        rate=probe.rate,
        timeout_s=timeout_s,
        seed=seed,
    )
    with TreeSampler(server.pid, interval=0.2, roles=servers.roles) as sampler:
        level = run_level_sync(spec)
    resources = sampler.result()
    kinds = level.errors_by_kind()
    return ProbeResult(
        probe=probe,
        sent=level.sent,
        errors=sum(kinds.values()),
        achieved_rps=round(level.achieved_rate or 0.0, 1),
        throughput_rps=round(level.throughput_rps, 1),
        p50_ms=level.latency_ms.get("p50"),
        p95_ms=level.latency_ms.get("p95"),
        p99_ms=level.latency_ms.get("p99"),
        memory_mib=resources.memory_mib,  # peak PSS of the tree (what --max-memory-mib caps)
        wall_s=round(time.monotonic() - started, 3),
        failed=None if level.sent else "no request was sent",
        generator_limited=level.generator_limited,
        mean_ms=level.latency_ms.get("mean"),
        resources=resources,
        error_kinds=kinds,
        log=None if servers.log is None else str(servers.log),
    )


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="twinserve-tune-") as folder:
        yield Path(folder)


def measure_facts(request: TuneRequest, cpus: int) -> ModelFacts:
    """The model's in-process batch curves (a subprocess, so its memory leaves with it), under each math-thread cap
    a candidate's processes get (none where the user chose the libraries' threads: the server leaves them too), and
    the cores."""
    with _scratch() as scratch:
        subject = request.subject
        # A repository version's model.py imports the files beside it, as the server lets it.
        beside = Path(request.model.rpartition(":")[0]).parent if subject and subject.repository else None
        caps = thread_caps(cpus)
        ceiling: list[Ceiling] = measure_in_subprocess(
            request.model, list(request.bodies), CEILING_SIZES, scratch, request.ceiling_budget_s, beside, caps
        )
    return ModelFacts(ceiling, cpus)


def run_tune(request: TuneRequest, name: str, cpus: int, on_probe: OnProbe | None = None) -> TuneOutcome:
    """Measure, prune, plan, then probe until the policy decides; every server is stopped on the way out."""
    started = time.monotonic()
    facts = measure_facts(request, cpus)
    own = request.subject.settings if request.subject is not None else None
    space = search_space(facts, request.goal.target_rps, request.archs, own, request.goal.slo_p95_ms)
    left = request.budget_s - (time.monotonic() - started) - max(STOP_S, STOP_SHARE * request.budget_s)
    plan = plan_search(
        space.candidates,
        space.priors,
        request.goal,
        max(left, 0.0),
        repeats=request.repeats,
        min_probe_s=request.min_probe_s,
        max_probe_s=request.max_probe_s,
        overhead_s=DEFAULT_OVERHEAD_S,
    )
    clock_start = time.monotonic()
    results: list[ProbeResult] = []
    with _scratch() as scratch:
        servers = ProbeServers(request, scratch)
        try:
            while True:
                step = next_step(plan, results, time.monotonic() - clock_start)
                if isinstance(step, Decision):
                    decision = step
                    break
                result = measure_probe(servers, step, name, request, seed=len(results))
                results.append(result)
                if on_probe is not None:
                    on_probe(len(results), result, time.monotonic() - started, plan)
        finally:
            servers.close()
    return TuneOutcome(request, facts, space, plan, decision, results, name, round(time.monotonic() - started, 2))
