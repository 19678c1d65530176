"""What `twinserve k8s` deploys (`K8sPlan`) and what each of its pods asks for (`sizing`):

- CPU request: one core per process doing model work (sync and async workers; hybrid model workers), plus
  `FRONT_CPU` per hybrid front process. No CPU limit: throttling a GIL-bound worker only adds latency.
- Memory request = limit: `MEMORY_HEADROOM` x the processes' memory, per process and role from bench's or tune's
  results when given (PSS, which is how the container's cgroup charges pages the forked workers share: once;
  RSS from older results), plus the supervisor's where one was measured; else `memory_per_process_mib` each.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from twinserve.config import Config
from twinserve.deploy.monitoring import Objectives
from twinserve.lab.advise import AutoscalingTargets
from twinserve.lab.results import MODEL_WORKER, PROCESS, SERVER, SUPERVISOR

__all__ = [
    "DEFAULT_MEMORY_PER_PROCESS_MIB",
    "FRONT_CPU",
    "MEMORY_HEADROOM",
    "K8sPlan",
    "Sizing",
    "cpu_request_cores",
    "process_counts",
    "sizing",
    "supervisors",
]

DEFAULT_MEMORY_PER_PROCESS_MIB = 512.0
MEMORY_HEADROOM = 1.25
FRONT_CPU = 0.5


@dataclass(frozen=True)
class K8sPlan:
    """What to deploy: a validated Config (workers pinned, host 0.0.0.0) plus the cluster-side choices."""

    config: Config
    image: str
    name: str = "twinserve"
    namespace: str | None = None
    replicas: int | None = None  # a fixed count, no autoscaler
    autoscale: tuple[int, int] = (2, 10)  # min, max replicas when `replicas` is None
    memory_per_process_mib: float = DEFAULT_MEMORY_PER_PROCESS_MIB
    targets: AutoscalingTargets | None = None  # from bench results; None: the defaults
    startup_timeout_s: float = 600.0
    #: (Secret name, key) whose value becomes TWINSERVE_API_KEYS (comma-separated keys); None: no API keys.
    api_key_secret: tuple[str, str] | None = None
    #: What the alerting rules hold the deployment to.
    objectives: Objectives = dataclasses.field(default_factory=Objectives)
    #: With --model-repository: an existing PersistentVolumeClaim holding it (mounted read-only at
    #: REPOSITORY_PATH); None: the image holds it there.
    repository_volume: str | None = None


@dataclass(frozen=True)
class Sizing:
    cpu_cores: float
    memory_mib: int
    server_processes: int
    model_processes: int


def supervisors(config: Config) -> int:
    """gunicorn's arbiter; uvicorn's process manager when it runs several workers."""
    return 1 if config.arch == "sync" or config.effective_workers > 1 else 0


def process_counts(config: Config) -> tuple[int, int]:
    """(server processes, model-worker processes) one pod runs, supervisors included."""
    workers = config.effective_workers
    model = workers * config.model_workers if config.resolved_arch_executor == "process" else 0
    return workers + supervisors(config), model


def cpu_request_cores(config: Config) -> float:
    """Cores the processes doing model work can keep busy: one each (the GIL caps a process's threads)."""
    workers = config.effective_workers
    if config.resolved_arch_executor == "process":
        return workers * config.model_workers + FRONT_CPU * workers
    return float(workers)


def _per_process_mib(plan: K8sPlan) -> tuple[float, float, float]:
    """MiB of one server process, one model worker and one supervisor: from the plan's results when it has them
    (PSS, else RSS; a supervisor not measured is counted as a server), else `memory_per_process_mib` each."""
    default = plan.memory_per_process_mib
    resources = plan.targets.basis.level.resources if plan.targets is not None else None
    if resources is None:
        return default, default, default
    by_role: dict[str, float] = {}
    for process in resources.per_process:
        mib = process.pss_mib if process.pss_mib is not None else process.rss_mib
        by_role[process.role] = max(by_role.get(process.role, 0.0), mib)
    whole = resources.memory_mib / max(resources.processes, 1)
    server = by_role.get(SERVER, by_role.get(PROCESS, whole))
    return server, by_role.get(MODEL_WORKER, server), by_role.get(SUPERVISOR, server)


def sizing(plan: K8sPlan) -> Sizing:
    servers, models = process_counts(plan.config)
    server_mib, model_mib, supervisor_mib = _per_process_mib(plan)
    supervisor = supervisors(plan.config)
    memory = MEMORY_HEADROOM * ((servers - supervisor) * server_mib + models * model_mib + supervisor * supervisor_mib)
    return Sizing(cpu_request_cores(plan.config), 64 * math.ceil(memory / 64), servers, models)
