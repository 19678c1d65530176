"""What `twinserve tune` searches: the settings worth a real server, pruned with what is known of the model.

Known before any server starts: the model's in-process batch curve (`twinserve.lab.ceiling`) and the machine's
cores. From those the batch size, delay, processes and sync threads (Little's law) are bounded, and settings that
cannot pay are dropped (batching that does not raise rows/s, hybrid when predict is shorter than the hop, a target
rate out of reach). Each candidate's prior, its throughput at the model's speed under the math-thread cap its
processes get (priced uncapped, several capped processes looked like one), orders the survivors. A model's own
settings give each architecture a first candidate "as the model sets it", always measured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from twinserve.lab.ceiling import MULTI_THREADED, curve, process_counts, room
from twinserve.lab.results import Ceiling
from twinserve.lab.variants import Variant

__all__ = ["BATCHING_GAIN", "ModelFacts", "Pruned", "Space", "search_space"]

#: Batching is searched when batch-32 rows/s beat batch-1 rows/s by at least this factor.
BATCHING_GAIN = 1.3
#: Below this single-request time (ms) a model process hop (pickling, a pipe, a wake-up) costs about as much as
#: the work it moves off the event loop: hybrid cannot win.
HYBRID_MIN_SERVICE_MS = 0.3
#: Time in the server beyond predict (parse, route, encode, write), for Little's law, in ms.
FRONT_MS = 1.0
#: Little's law headroom for Poisson bursts.
BURST = 2.0
#: The share of the P95 objective one batch's predict may take (the largest batch size tried).
BATCH_SHARE = 1 / 3
#: The share of the P95 objective a batch may spend waiting to fill (the batch delay tried).
SLO_SHARE = 0.05
#: With a target rate, a candidate whose prior is below this share of it is dropped.
REACH = 0.8


@dataclass(frozen=True)
class ModelFacts:
    """What the ceiling probe measured, and the machine."""

    ceiling: Sequence[Ceiling]
    cpus: int

    def _at(self, batch_size: int, threads: int | None = None) -> Ceiling:
        """The measurement at `batch_size`, or at the nearest measured size below (a floor), under `threads`."""
        known = sorted(curve(self.ceiling, threads), key=lambda c: c.batch_size)
        below = [c for c in known if c.batch_size <= batch_size] or known[:1]
        return below[-1]

    def rows_per_s(self, batch_size: int, threads: int | None = None) -> float:
        """In-process rows/s at `batch_size`, with at most `threads` math threads (None: as many as it uses)."""
        return self._at(batch_size, threads).instances_per_s

    def cores(self, batch_size: int, threads: int | None = None) -> float:
        """The cores predict kept busy at `batch_size`, with at most `threads` math threads."""
        return self._at(batch_size, threads).cores

    @property
    def multi_threaded(self) -> bool:
        """Whether predict computed on more than one core (in a library that leaves the GIL to do it)."""
        return any(c.cores >= MULTI_THREADED for c in self.ceiling)

    @property
    def single_ms(self) -> float:
        """The service time of one request alone (batch 1), in ms."""
        return 1000.0 / max(self.rows_per_s(1), 1e-9)

    def batch_size(self, slo_p95_ms: float | None) -> int:
        """The largest measured batch size whose predict takes at most BATCH_SHARE of the objective: under load
        a request may wait for the batch ahead of it, then compute in its own, and still meet its P95."""
        fastest = curve(self.ceiling)
        sizes = sorted(c.batch_size for c in fastest)
        if slo_p95_ms is None:
            return sizes[-1]
        fit = [c.batch_size for c in fastest if c.batch_ms_median <= BATCH_SHARE * slo_p95_ms]
        return max(fit, default=sizes[0])

    def batching_helps(self, batch_size: int) -> bool:
        return batch_size > 1 and self.rows_per_s(batch_size) >= BATCHING_GAIN * self.rows_per_s(1)


@dataclass(frozen=True)
class Pruned:
    label: str
    reason: str


@dataclass(frozen=True)
class Space:
    """The candidates to probe, most promising first, each with its prior (req/s); and what was left out, why."""

    candidates: list[Variant]
    priors: dict[str, float]
    pruned: list[Pruned]
    notes: list[str]


def _batchings(facts: ModelFacts, size: int, slo_p95_ms: float | None) -> list[tuple[int, float]]:
    """(max batch size, max batch delay ms) pairs worth trying, batches of at most `size`."""
    if not facts.batching_helps(size):
        return [(1, 0.0)]
    # The delay worth trying: a share of the latency objective (SLO_SHARE), which every request can afford to
    # spend waiting for company; at least one service time (a shorter wait rarely lets a batch fill). On a fast
    # model the service time alone is far too short: tune then picked a delay that served well below the grid's
    # best (benchmarks/tune_vs_grid.py, docs/tuning.md).
    share = SLO_SHARE * slo_p95_ms if slo_p95_ms is not None else 0.0
    delay = round(min(max(facts.single_ms, share, 0.5), 20.0), 1)
    return [(1, 0.0), (size, 0.0), (size, delay)]


def _prior(processes: int, batch: int, facts: ModelFacts, at_once: int | None = None) -> float:
    """Requests/s `processes` processes could serve: each request's share of a batch's predict plus what the
    server spends on it around predict (FRONT_MS). An optimistic guess, where capacity searches start from.

    `at_once`: the predicts the server may run at the same time (default: one per process; more where sync's
    request threads each call predict). It caps each one's math threads at its share of the cores, so each computes
    at the speed measured under that cap, and they add up only while the cores last: a predict that still computes
    on k cores (where no cap was measured: a user's own OMP_NUM_THREADS) leaves room for cpus / k of them. Threads
    of one process compute at once only in a library that leaves the GIL, as one that uses several cores does."""
    at_once = at_once or processes
    threads = max(1, facts.cpus // at_once)
    per_request_s = 1.0 / facts.rows_per_s(batch, threads) + FRONT_MS / 1000.0
    parallel = at_once if facts.multi_threaded else processes
    return round(min(parallel, room(facts.cpus, facts.cores(batch, threads))) / per_request_s, 1)


def _threads(rate: float, facts: ModelFacts, count: int, batch: int) -> int:
    """Sync threads per worker by Little's law: requests in the server = rate x time there (the rate at most the
    prior), with BURST headroom; a batch fills from the worker's own request threads: at least as many."""
    in_flight = rate * (facts.single_ms + FRONT_MS) / 1000.0
    threads = max(math.ceil(BURST * in_flight / count), batch if batch > 1 else 1)
    return max(1, min(64, threads))


def _sync_threads(
    target_rps: float | None, prior: float, facts: ModelFacts, count: int, batch: int
) -> tuple[int, float]:
    """Sync's threads per worker, and its prior with them: without batching, each request thread calls predict on
    its own share of the cores, which changes the prior, and the prior the threads: recomputed once."""
    threads = _threads(min(target_rps or prior, prior), facts, count, batch)
    if batch == 1:
        prior = _prior(count, batch, facts, count * threads)
        threads = _threads(min(target_rps or prior, prior), facts, count, batch)
    return threads, prior


def _own_candidates(
    own: Mapping[str, Any], facts: ModelFacts, target_rps: float | None, archs: Sequence[str]
) -> list[tuple[Variant, float]]:
    """One candidate per architecture with the model's own knobs; the server's processes up to the cores."""
    knobs = {k: own[k] for k in ("max_batch_size", "max_batch_delay_ms", "model_workers", "executor") if k in own}
    batch = int(knobs.get("max_batch_size") or 1)
    found: list[tuple[Variant, float]] = []
    for arch in archs:
        settings: dict[str, Any] = {}
        if arch == "hybrid":
            settings.update(workers=1, model_workers=int(knobs.get("model_workers") or facts.cpus))
            processes = settings["model_workers"]
        else:
            settings["workers"] = processes = facts.cpus
        prior = _prior(processes, batch, facts)
        if arch == "sync":
            settings["threads"], prior = _sync_threads(target_rps, prior, facts, processes, batch)
        settings.update({k: v for k, v in knobs.items() if k not in settings})
        found.append((Variant(arch, settings), prior))  # type: ignore[arg-type]
    return found


def search_space(
    facts: ModelFacts,
    target_rps: float | None = None,
    archs: Sequence[str] = (),
    own: Mapping[str, Any] | None = None,
    slo_p95_ms: float | None = None,
) -> Space:
    """Every candidate worth a server for this model on this machine, and the reasons for the rest; `own`: the
    model's per-model settings, the search's starting point; `slo_p95_ms`: the objective, which sizes the batch
    delay tried."""
    archs = list(archs) or ["sync", "async", "hybrid"]
    pruned: list[Pruned] = []
    notes: list[str] = []
    executor = (own or {}).get("executor")
    if "hybrid" in archs and executor not in (None, "auto", "process"):
        archs.remove("hybrid")
        pruned.append(
            Pruned("hybrid", f"the model's own settings ask for executor {executor!r}; hybrid runs processes")
        )
    size = facts.batch_size(slo_p95_ms)
    batchings = _batchings(facts, size, slo_p95_ms)
    if size == 1:
        smallest = min((c.batch_size for c in facts.ceiling if c.batch_size > 1), default=2)
        notes.append(
            f"no batching: a batch of {smallest} takes more than {BATCH_SHARE:.0%} of the objective in-process"
        )
    elif len(batchings) == 1:
        notes.append(
            f"no batching: batch-{size} does {facts.rows_per_s(size):,.0f} rows/s in-process, batch-1 "
            f"{facts.rows_per_s(1):,.0f} (less than x{BATCHING_GAIN:g})"
        )
    else:
        notes.append(
            f"batching searched up to {size} (the largest batch within {BATCH_SHARE:.0%} of the objective): "
            f"batch-{size} does {facts.rows_per_s(size):,.0f} rows/s in-process, batch-1 {facts.rows_per_s(1):,.0f}"
        )
    processes = process_counts(facts.cpus)
    notes.append(f"processes up to the {facts.cpus} core(s): {', '.join(map(str, processes))}")
    caps = sorted({c.threads for c in facts.ceiling if c.threads is not None}, reverse=True)
    if len(caps) > 1:
        speeds = ", ".join(f"{facts.rows_per_s(size, cap):,.0f} on {cap}" for cap in caps)
        notes.append(
            f"predict computes on several cores: each process priced at its share of them (math threads capped "
            f"as the server caps them); batch-{size} rows/s in-process: {speeds} thread(s)"
        )
    found: list[tuple[Variant, float]] = []
    for arch in archs:
        if arch == "hybrid" and facts.single_ms < HYBRID_MIN_SERVICE_MS:
            pruned.append(
                Pruned("hybrid", f"one predict takes {facts.single_ms:.3f} ms, less than a hop to a model process")
            )
            continue
        for count in processes:
            for batch, delay in batchings:
                if arch != "sync" and batch == 1 and len(batchings) > 1:
                    # With no delay an async batch forms only while the model is busy: batch 32 costs an idle
                    # server nothing and a busy one gains, so batch 1 is dominated once batching pays.
                    continue
                settings: dict[str, int | float] = {}
                if arch == "hybrid":
                    settings.update(workers=1, model_workers=count)
                else:
                    settings["workers"] = count
                settings.update(max_batch_size=batch, max_batch_delay_ms=delay)
                prior = _prior(count, batch, facts)
                if arch == "sync":
                    settings["threads"], prior = _sync_threads(target_rps, prior, facts, count, batch)
                variant = Variant(arch, dict(settings))  # type: ignore[arg-type]
                if target_rps is not None and prior < REACH * target_rps:
                    pruned.append(
                        Pruned(
                            variant.label,
                            f"at most {prior:,.0f} req/s at the model's in-process speed, short of {target_rps:g}",
                        )
                    )
                    continue
                found.append((variant, prior))
    # Most promising first; among equals, the cheaper (fewer processes, no batching wait).
    found.sort(key=lambda vp: (-vp[1], sum(int(v) for v in vp[0].settings.values() if isinstance(v, int))))
    if own is not None:
        # The model's own settings first, whatever their prior: the search starts from what the model says.
        first = _own_candidates(own, facts, target_rps, archs)
        labels = {v.label for v, _ in first}
        found = first + [vp for vp in found if vp[0].label not in labels]
        notes.append(f"the model's own settings first: {', '.join(v.label for v, _ in first)}")
    return Space([v for v, _ in found], {v.label: p for v, p in found}, pruned, notes)
