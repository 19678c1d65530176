"""Prometheus metrics, the same names in every architecture and correct across processes.

Every server process (gunicorn workers, uvicorn workers) writes its samples to files in one directory shared
by the whole server (prometheus-client's multiprocess mode); `/metrics` on any worker aggregates all of them,
so a scrape counts every request whichever worker answered it. `prepare_multiprocess_dir` must run before
prometheus-client is first imported in the server's parent process: the CLI does it first thing.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from twinserve.observability.sums import metric_sums

__all__ = [
    "CONTENT_TYPE",
    "MULTIPROC_ENV",
    "REJECTION_REASONS",
    "InferenceTotals",
    "inference_totals",
    "mark_process_dead",
    "metrics",
    "prepare_multiprocess_dir",
    "reap_dead_processes",
    "record_death",
    "render",
    "start_memory_sampler",
]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: How often each process looks for the live gauges of processes that died without a word (`reap_dead_processes`).
REAP_INTERVAL_S = 5.0

logger = logging.getLogger("twinserve.metrics")

#: prometheus-client names a process's file of `live*` gauges `gauge_<mode>_<pid>.db`.
_LIVE_GAUGE_FILE = re.compile(r"^gauge_live[a-z]*_(\d+)\.db$")

#: Model serving spans sub-millisecond tabular models to multi-second generative ones: one set of buckets.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
#: A shadow version's time less its primary's: either may be the slower, by sub-milliseconds to seconds.
DIFFERENCE_BUCKETS = (
    -5.0, -1.0, -0.25, -0.1, -0.025, -0.01, -0.0025, -0.001, 0.0, 0.001, 0.0025, 0.01, 0.025, 0.1, 0.25, 1.0, 5.0,
)  # fmt: skip
#: A model's cold start, import to ready: from a toy's milliseconds to a large model's minutes.
LOAD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

#: Error codes that mean "refused by admission control", and the reason label each is counted under.
REJECTION_REASONS = {
    "queue_full": "queue_full",
    "deadline_exceeded": "deadline",
    "deadline_unmeetable": "deadline_unmeetable",
    "rate_limited": "rate_limit",
    "payload_too_large": "body_too_large",
    "too_many_instances": "body_too_large",
    "too_many_elements": "body_too_large",
    "client_disconnected": "disconnect",
    "too_many_pending": "websocket_pending",
    "shutting_down": "shutting_down",
}


def prepare_multiprocess_dir() -> str:
    """Point prometheus-client at a fresh per-server directory (unless the user chose one); returns it."""
    existing = os.environ.get(MULTIPROC_ENV)
    if existing:
        os.makedirs(existing, exist_ok=True)
        return existing
    path = tempfile.mkdtemp(prefix="twinserve-metrics-")
    os.environ[MULTIPROC_ENV] = path
    parent = os.getpid()
    # Only the process that made it removes it: workers forked from it inherit atexit handlers too.
    atexit.register(lambda: shutil.rmtree(path, ignore_errors=True) if os.getpid() == parent else None)
    return path


class _Metrics:
    """The metric objects, created on first use (after the multiprocess directory is known)."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self.requests = Counter("twinserve_requests_total", "HTTP requests answered.", ["model", "endpoint", "code"])
        self.request_seconds = Histogram(
            "twinserve_request_duration_seconds",
            "Time from request received to response ready.",
            ["model", "endpoint"],
            buckets=LATENCY_BUCKETS,
        )
        # Only errors add to it, so successful requests pay nothing (their time is the histogram's sum less this).
        self.failed_seconds = Counter(
            "twinserve_failed_request_seconds", "Time spent on requests answered with an error.", ["model", "endpoint"]
        )
        self.rejected = Counter(
            "twinserve_rejected_requests_total", "Requests refused by admission control.", ["model", "reason"]
        )
        self.early_refusals = Counter(
            "twinserve_early_refusals_total",
            "Requests refused by the HTTP server from their head, before the app (a full queue): also counted in "
            "twinserve_requests_total and twinserve_rejected_requests_total.",
            ["model"],
        )
        self.unparsed = Counter(
            "twinserve_unparsed_requests_total",
            "Requests the HTTP server answered before any route, as it could not read them: 400 malformed_http "
            "(llhttp refused them), 414 uri_too_long, 431 headers_too_large (past --max-request-line, "
            "--max-header-count, --max-header-bytes), by that error code: also counted in twinserve_requests_total, "
            "with no model or endpoint.",
            ["reason"],
        )
        self.by_priority = Counter(
            "twinserve_priority_requests_total",
            "Requests for a model by priority level (1 is the highest) and outcome: ok (2xx), refused (by admission "
            "control), error (any other status).",
            ["model", "priority", "outcome"],
        )
        self.by_version = Counter(
            "twinserve_version_requests_total",
            "Requests a model version answered, by outcome: ok (2xx), refused (by admission control), error (any "
            "other status); a model repository serves several versions of a model at once.",
            ["model", "version", "outcome"],
        )
        self.version_seconds = Histogram(
            "twinserve_version_request_duration_seconds",
            "Time from request received to response ready, per model version (servers of a model repository only): "
            "a canary's latency beside its default version's.",
            ["model", "version"],
            buckets=LATENCY_BUCKETS,
        )
        self.shadow = Counter(
            "twinserve_shadow_requests_total",
            "Requests mirrored to a model's shadow version, by outcome: agree or disagree (its outputs against the "
            "primary's), error (it failed), dropped (not computed: the shadow queue was full or the version busy).",
            ["model", "primary", "shadow", "outcome"],
        )
        self.shadow_difference = Histogram(
            "twinserve_shadow_latency_difference_seconds",
            "A shadow version's predict time less its primary's request time (negative: the shadow was faster).",
            ["model", "primary", "shadow"],
            buckets=DIFFERENCE_BUCKETS,
        )
        self.in_flight = Gauge(
            "twinserve_in_flight_requests",
            "Requests being handled now (health probes and scrapes are not counted).",
            multiprocess_mode="livesum",
        )
        self.queued = Gauge(
            "twinserve_queued_instances", "Instances waiting for a model worker.", ["model"],
            multiprocess_mode="livesum",
        )  # fmt: skip
        self.queue_wait = Histogram(
            "twinserve_queue_wait_seconds", "Time an instance waited to be batched.", ["model"],
            buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.inference_seconds = Histogram(
            "twinserve_inference_duration_seconds", "Time one predict call (one batch) took.", ["model"],
            buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.compute_seconds = Counter(
            "twinserve_request_compute_seconds",
            "Predict time as the requests saw it: each request in a batch counts the batch's whole predict call.",
            ["model"],
        )
        self.batch_size = Histogram(
            "twinserve_batch_size", "Instances per predict call.", ["model"], buckets=BATCH_BUCKETS
        )
        self.isolations = Counter(
            "twinserve_batch_isolations_total",
            "Failed batches of several requests re-run in halves to find the failing requests.",
            ["model"],
        )
        self.isolation_reruns = Counter(
            "twinserve_batch_isolation_reruns_total", "Predict re-runs spent isolating failing requests.", ["model"]
        )
        self.isolation_requests = Counter(
            "twinserve_batch_isolation_requests_total",
            "Requests of isolated batches, by outcome: answered, or failed alone.",
            ["model", "outcome"],
        )
        self.first_chunk_seconds = Histogram(
            "twinserve_time_to_first_chunk_seconds", "Time from a stream request received to its first step ready.",
            ["model"], buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.cache = Counter("twinserve_cache_requests_total", "Cache lookups per instance.", ["model", "result"])
        self.load_seconds = Histogram(
            "twinserve_model_load_seconds",
            "Cold start of a model version, as its 'ready in' log line says: its import and construction plus its "
            "load() (hybrid: its model workers' start and load) to ready; each load, at start or on demand.",
            ["model", "version"], buckets=LOAD_BUCKETS,
        )  # fmt: skip
        self.evictions = Counter(
            "twinserve_model_evictions_total",
            "Models unloaded to make room for another (--max-loaded-models: the least recently used goes).",
            ["model"],
        )
        # liveall: one series per live process (prometheus-client adds the `pid` label); livesum: their total.
        self.memory = Gauge(
            "twinserve_process_resident_memory_bytes", "Resident memory of one server or model-worker process.",
            ["role"], multiprocess_mode="liveall",
        )  # fmt: skip
        self.memory_total = Gauge(
            "twinserve_resident_memory_bytes", "Resident memory of all the server's processes.",
            multiprocess_mode="livesum",
        )  # fmt: skip
        self.worker_deaths = Counter(
            "twinserve_worker_deaths_total",
            "Server and model-worker processes that died while the server ran (killed, crashed, OOM-killed), "
            "not stopped by it.",
        )


_metrics: _Metrics | None = None


def metrics() -> _Metrics:
    global _metrics
    if _metrics is None:
        _metrics = _Metrics()
    return _metrics


def start_memory_sampler(role: str, interval: float = 1.0) -> None:
    """Sample this process's RSS every `interval` seconds into the memory gauges (S4: memory per worker).

    The same thread reaps dead processes' live gauges as this process starts and every `REAP_INTERVAL_S` after.
    """
    import threading

    import psutil

    process = psutil.Process()
    per_process = metrics().memory.labels(role)  # from here a scrape sees this process, at 0 until sampled
    total = metrics().memory_total
    # Both sampled at once, not when the thread first runs: a scrape that sees this process sees its RSS in the
    # total too (a CI run read a total short of one process, its thread not yet run while the loop was busy).
    rss = process.memory_info().rss
    per_process.set(rss)
    total.set(rss)

    def sample() -> None:
        reaped_at = float("-inf")
        while True:
            rss = process.memory_info().rss
            per_process.set(rss)
            total.set(rss)
            if time.monotonic() - reaped_at >= REAP_INTERVAL_S:
                try:
                    reap_dead_processes()
                except (OSError, psutil.Error):
                    logger.exception("could not look for dead processes' gauges")
                reaped_at = time.monotonic()
            time.sleep(interval)

    threading.Thread(target=sample, name="twinserve-memory", daemon=True).start()


def _registry() -> Any:
    """Every process of this server's samples (multiprocess mode), else this process's default registry."""
    from prometheus_client import REGISTRY, CollectorRegistry, multiprocess

    if not os.environ.get(MULTIPROC_ENV):  # in-process use (tests of the core, embedding)
        return REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return registry


#: Reads of the processes' metric files before a scrape gives up on one being created (see `render`).
RENDER_ATTEMPTS = 3


def render() -> bytes:
    """The Prometheus text exposition of every process of this server.

    A process that starts while a scrape reads the files (a replacement worker or model worker) may have created
    its file and not yet written its header: prometheus-client's reader then raises `struct.error` (a CI run's
    scrape was answered 500 `internal error: error` so). Read again: a file is whole a moment later.
    """
    import struct

    from prometheus_client import generate_latest

    metric_sums().flush()  # this process's writes held for the interval (observability/sums.py)
    for _ in range(RENDER_ATTEMPTS - 1):
        with contextlib.suppress(struct.error):
            return bytes(generate_latest(_registry()))
        time.sleep(0.01)
    return bytes(generate_latest(_registry()))


@dataclass
class InferenceTotals:
    """One model's inference counters, summed over every process of the server (for V2 statistics)."""

    requests: float = 0.0  # answered requests to its inference endpoints
    succeeded: float = 0.0  # of which with a 2xx status
    seconds: float = 0.0  # their total time, received to answered
    failed_seconds: float = 0.0  # the part of it spent on the failed ones
    computed: float = 0.0  # requests that went through a predict call (once per batch they were in)
    queue_seconds: float = 0.0  # their total wait for a batch
    compute_seconds: float = 0.0  # their total predict time, each counting its batch's whole call
    batches: float = 0.0  # predict calls
    instances: float = 0.0  # instances predicted (cache hits excluded)
    cache_hits: float = 0.0  # per instance
    cache_misses: float = 0.0


def inference_totals(endpoints: Collection[str]) -> dict[str, InferenceTotals]:
    """Totals per model, from the same samples `/metrics` shows; `endpoints` are the inference endpoints."""
    totals: dict[str, InferenceTotals] = {}
    metric_sums().flush()
    for family in _registry().collect():
        for sample in family.samples:
            model = sample.labels.get("model")
            if not model:
                continue
            name, labels, value = sample.name, sample.labels, sample.value
            t = totals.get(model) or totals.setdefault(model, InferenceTotals())
            endpoint_matches = labels.get("endpoint") in endpoints
            if name == "twinserve_requests_total" and endpoint_matches:
                t.requests += value
                if labels["code"].startswith("2"):
                    t.succeeded += value
            elif name == "twinserve_request_duration_seconds_sum" and endpoint_matches:
                t.seconds += value
            elif name == "twinserve_failed_request_seconds_total" and endpoint_matches:
                t.failed_seconds += value
            elif name == "twinserve_queue_wait_seconds_count":
                t.computed += value
            elif name == "twinserve_queue_wait_seconds_sum":
                t.queue_seconds += value
            elif name == "twinserve_request_compute_seconds_total":
                t.compute_seconds += value
            elif name == "twinserve_batch_size_count":
                t.batches += value
            elif name == "twinserve_batch_size_sum":
                t.instances += value
            elif name == "twinserve_cache_requests_total":
                if labels["result"] == "hit":
                    t.cache_hits += value
                else:
                    t.cache_misses += value
    return totals


def mark_process_dead(pid: int) -> None:
    """Drop a dead worker's live gauges (in-flight, queued, memory) from the aggregate."""
    if os.environ.get(MULTIPROC_ENV):
        from prometheus_client import multiprocess

        # Another process may be reaping the same pid: whichever removes a file first wins; the rest is retried.
        with contextlib.suppress(FileNotFoundError):
            multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


def reap_dead_processes() -> list[int]:
    """Drop the live gauges of every process that wrote some and is gone; return their pids.

    gunicorn's arbiter reports its dead workers (`child_exit`), but a uvicorn worker or a model worker killed by
    SIGKILL or the OOM killer never runs its shutdown, and its gauges would count forever. Every process of one
    server shares this host's pid namespace, so a pid with no live process (or a zombie) is a dead writer.
    A reused pid keeps its predecessor's gauges until it dies in turn.
    """
    directory = os.environ.get(MULTIPROC_ENV)
    if not directory:
        return []
    pids = {int(m.group(1)) for name in os.listdir(directory) if (m := _LIVE_GAUGE_FILE.match(name))}
    dead = sorted(pid for pid in pids if not _alive(pid))
    for pid in dead:
        if record_death(pid):
            logger.info("dropped the live gauges of process %d, which died without a word", pid)
    return dead


def record_death(pid: int) -> bool:
    """Count the death of `pid` in `twinserve_worker_deaths_total` and drop its live gauges; True if counted here.

    Whoever notices first counts it (the reaper of any process, gunicorn's arbiter, the model-worker pool), once:
    the one whose removal of the process's `livesum` gauge file succeeds (a removal is atomic; every serving
    process has that file from its memory sampler on). A process that stopped in order removed its own live
    gauges, so it has none left and is not counted.
    """
    directory = os.environ.get(MULTIPROC_ENV)
    if not directory:
        metrics().worker_deaths.inc()
        return True
    try:
        os.remove(os.path.join(directory, f"gauge_livesum_{pid}.db"))
    except FileNotFoundError:
        counted = False  # stopped in order, or another process counted it
    else:
        metrics().worker_deaths.inc()
        counted = True
    mark_process_dead(pid)
    return counted


def _alive(pid: int) -> bool:
    import psutil

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # another user's process: not ours to judge
