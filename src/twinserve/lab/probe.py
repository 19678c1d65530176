"""Watching a server from outside while it is under load: its process tree (psutil) and its own /metrics."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import httpx
import psutil

from twinserve.lab.results import HELPER, PROCESS, SUPERVISOR, ProcessMemory, Resources, ServerStats
from twinserve.lab.servers import loopback

__all__ = ["MetricsSnapshot", "TreeSampler", "scrape", "server_stats", "tree_rss_mib"]

MiB = 1024 * 1024


def _tree(root: psutil.Process) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return [root, *root.children(recursive=True)]
    return []


def tree_rss_mib(pid: int) -> float:
    """Resident memory of a process and all its descendants (workers, model workers), in MiB, read once."""
    total = 0
    for process in _tree(psutil.Process(pid)):
        with contextlib.suppress(psutil.NoSuchProcess):  # a worker that exited between listing and reading
            total += process.memory_info().rss
    return total / MiB


def _kernel_counts(proc: psutil.Process) -> tuple[float, float] | None:
    """PSS and USS of one process in MiB, from /proc/PID/smaps_rollup (psutil); None where the OS has neither.

    PSS charges each shared page to its sharers in equal parts, so the tree's PSS adds up to what the kernel
    holds for it; RSS counts a page once in every process that maps it (forked workers share their parent's).
    """
    with contextlib.suppress(psutil.Error, AttributeError):
        info = proc.memory_full_info()
        return info.pss / MiB, info.uss / MiB
    return None


@dataclass
class TreeSampler:
    """Samples the memory and CPU of a process and all its descendants in a thread.

    RSS and CPU every `interval` seconds (CPU summed over the tree as a percentage of one core); PSS and USS every
    `kernel_interval` seconds and once at the end: reading them walks each process's page tables, too costly to do
    several times a second beside a measured server.

    `roles` (pid -> role, from the server's /metrics) names the processes that announce themselves (`server`,
    `model_worker`); of the others, the root is the `supervisor` (gunicorn's arbiter, uvicorn's process manager:
    it holds no model) and the rest are `helper`s (multiprocessing's resource tracker). With no roles at all (not
    a twinserve server) every process is a `process`.
    """

    pid: int
    interval: float = 0.25
    roles: dict[int, str] = field(default_factory=dict)
    kernel_interval: float = 1.0
    _rss: list[float] = field(default_factory=list)
    _pss: list[float] = field(default_factory=list)
    _cpu: list[float] = field(default_factory=list)
    _peak: dict[int, float] = field(default_factory=dict)
    _peak_pss: dict[int, float] = field(default_factory=dict)
    _uss: dict[int, float] = field(default_factory=dict)
    _procs: dict[int, psutil.Process] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> TreeSampler:
        self._thread = threading.Thread(target=self._loop, name="twinserve-bench-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def role(self, pid: int) -> str:
        if not self.roles:
            return PROCESS
        return self.roles.get(pid) or (SUPERVISOR if pid == self.pid else HELPER)

    def _processes(self) -> list[psutil.Process]:
        with contextlib.suppress(psutil.Error):
            root = self._procs.get(self.pid) or psutil.Process(self.pid)
            current = {p.pid: p for p in _tree(root)}
            for pid, proc in current.items():
                if pid not in self._procs:
                    self._procs[pid] = proc
                    with contextlib.suppress(psutil.Error):
                        proc.cpu_percent(None)  # prime: the first call has no interval to measure over
            return [self._procs[pid] for pid in current]
        return []

    def _read_kernel_counts(self, processes: list[psutil.Process]) -> None:
        total: float | None = 0.0
        for proc in processes:
            counts = _kernel_counts(proc)
            if counts is None:
                total = None
                continue
            pss, self._uss[proc.pid] = counts
            self._peak_pss[proc.pid] = max(pss, self._peak_pss.get(proc.pid, 0.0))
            if total is not None:
                total += pss
        if total is not None and processes:
            self._pss.append(total)

    def _loop(self) -> None:
        self._read_kernel_counts(self._processes())
        kernel_due = time.monotonic() + self.kernel_interval
        while not self._stop.wait(self.interval):
            rss = cpu = 0.0
            processes = self._processes()
            for proc in processes:
                with contextlib.suppress(psutil.Error):
                    mem = proc.memory_info().rss / MiB
                    cpu += proc.cpu_percent(None)
                    rss += mem
                    self._peak[proc.pid] = max(mem, self._peak.get(proc.pid, 0.0))
            self._rss.append(rss)
            self._cpu.append(cpu)
            if time.monotonic() >= kernel_due:
                self._read_kernel_counts(processes)
                kernel_due = time.monotonic() + self.kernel_interval

    def result(self) -> Resources:
        processes = self._processes()
        self._read_kernel_counts(processes)
        per_process = [
            ProcessMemory(
                pid=proc.pid,
                role=self.role(proc.pid),
                rss_mib=round(self._peak.get(proc.pid, 0.0), 1),
                pss_mib=_rounded(self._peak_pss.get(proc.pid)),
                uss_mib=_rounded(self._uss.get(proc.pid)),
            )
            for proc in processes
        ]
        uss = [p.uss_mib for p in per_process]
        rss, cpu = self._rss or [0.0], self._cpu or [0.0]
        return Resources(
            samples=len(self._rss),
            processes=len(per_process),
            rss_mib_mean=round(sum(rss) / len(rss), 1),
            rss_mib_max=round(max(rss), 1),
            pss_mib_max=round(max(self._pss), 1) if self._pss else None,
            uss_mib_max=None if not uss or None in uss else round(sum(u for u in uss if u is not None), 1),
            cpu_percent_mean=round(sum(cpu) / len(cpu), 1),
            cpu_percent_max=round(max(cpu), 1),
            per_process=per_process,
        )


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


@dataclass(frozen=True)
class MetricsSnapshot:
    """Sums and counts of twinserve's histograms and counters at one moment, over every label value."""

    values: dict[str, float]
    roles: dict[int, str]

    def __sub__(self, before: MetricsSnapshot) -> dict[str, float]:
        return {k: v - before.values.get(k, 0.0) for k, v in self.values.items()}


_WANTED = (
    "twinserve_requests_total",
    "twinserve_batch_size_sum",
    "twinserve_batch_size_count",
    "twinserve_queue_wait_seconds_sum",
    "twinserve_queue_wait_seconds_count",
    "twinserve_inference_duration_seconds_sum",
    "twinserve_inference_duration_seconds_count",
    "twinserve_in_flight_requests",
    "twinserve_queued_instances",
)


def scrape(base_url: str) -> MetricsSnapshot | None:
    """Read the server's /metrics; None when it has none (or it is not a twinserve server)."""
    # Imported here: prometheus-client picks its storage at import, and the CLI that imports this module also
    # serves, which must first point it at the server's multiprocess directory.
    from prometheus_client.parser import text_string_to_metric_families

    try:
        reply = loopback().get(base_url + "/metrics", timeout=10)
    except httpx.HTTPError:
        return None
    if reply.status_code != 200:
        return None
    values: dict[str, float] = defaultdict(float)
    roles: dict[int, str] = {}
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            if sample.name in _WANTED:
                values[sample.name] += sample.value
            elif sample.name == "twinserve_process_resident_memory_bytes" and "pid" in sample.labels:
                roles[int(sample.labels["pid"])] = sample.labels.get("role", "server")
    return MetricsSnapshot(dict(values), roles)


def settle(base_url: str, deadline_s: float, poll_s: float = 0.1) -> bool:
    """Wait until the server has nothing in flight and nothing queued (its /metrics), at most `deadline_s`.

    After an overloaded run the server still computes what the load generator gave up on: a run started at once
    would measure that backlog, not its own load. Whether it settled in time."""
    until = time.monotonic() + deadline_s
    while True:
        snapshot = scrape(base_url)
        if snapshot is None:
            return False  # not a twinserve server, or gone: nothing to wait on
        in_flight = snapshot.values.get("twinserve_in_flight_requests", 0.0)  # the scrape is not counted
        if in_flight <= 0 and snapshot.values.get("twinserve_queued_instances", 0.0) <= 0:
            return True
        if time.monotonic() >= until:
            return False
        time.sleep(poll_s)


def _mean(total: float, count: float, scale: float = 1.0) -> float | None:
    return round(total / count * scale, 3) if count > 0 else None


def server_stats(before: MetricsSnapshot | None, after: MetricsSnapshot | None) -> ServerStats | None:
    if before is None or after is None:
        return None
    d = after - before
    return ServerStats(
        requests=int(d.get("twinserve_requests_total", 0)),
        batches=int(d.get("twinserve_batch_size_count", 0)),
        batch_size_mean=_mean(d.get("twinserve_batch_size_sum", 0), d.get("twinserve_batch_size_count", 0)),
        queue_wait_ms_mean=_mean(
            d.get("twinserve_queue_wait_seconds_sum", 0), d.get("twinserve_queue_wait_seconds_count", 0), 1000
        ),
        inference_ms_mean=_mean(
            d.get("twinserve_inference_duration_seconds_sum", 0),
            d.get("twinserve_inference_duration_seconds_count", 0),
            1000,
        ),
    )
