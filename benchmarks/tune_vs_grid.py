"""Is `twinserve tune` honest against exhaustive search? (Issue 19, item 3; a benchmark, not CI.)

For each built-in example: measure every point of an exhaustive grid (arch x workers x threads x max batch size x
batch delay x model workers) for its capacity at the SLO — the highest open-loop Poisson rate whose P95 meets
it, by the same ramp-and-bisect every point gets — and time it; then run `twinserve tune` with a quarter of the
grid's time as its budget, and re-measure tune's pick with the grid's own method. Prints, per example, tune's
pick and the grid's best with their capacities and P95 there, the time each took, and the two ratios the issue
asks for: pick / best capacity (>= 0.90) and tune time / grid time (<= 0.25).

    python benchmarks/tune_vs_grid.py [--examples tabular,embed,io] [--slo-p95-ms MS] [--seconds 3]
    python benchmarks/tune_vs_grid.py --quick [--examples tabular] [--archs sync,async,hybrid]

The full grid takes long (tens of minutes per example on a small machine): run it alone on a quiet machine.
`--quick` is the affordable check (under ~8 minutes an example on 2 cores): a smaller grid (processes = the
cores only, 2 batchings, 2 sync thread counts: 8 points), 1 s probes, and a capacity search of at most 6 probes
bisected to 20%; the ratios are computed the same way, against that grid. `--archs` narrows both the grid and
tune to some architectures (a smoke test: `--quick --archs async --seconds 0.5`). The io example needs
`redis-server` (one is started); embed needs the `torch` extra.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from twinserve.core.threads import usable_cores
from twinserve.lab.servers import RedisServer
from twinserve.lab.tune.runner import ProbeServers, TuneRequest, measure_facts, measure_probe, model_bodies, run_tune
from twinserve.lab.tune.search import Goal, Probe, ProbeResult, meets
from twinserve.lab.variants import Variant

EXAMPLES = {
    "tabular": "twinserve.examples.tabular:Classifier",
    "embed": "twinserve.examples.embed:MiniLM",
    "io": "twinserve.examples.io:FeatureLookup",
}
#: The P95 objective per example (`--slo-p95-ms` sets one for all): MiniLM alone takes ~25 ms a request on two
#: cores, so 50 ms would leave it no room to queue and its capacity would be a few requests per second.
SLO_P95_MS = {"tabular": 50.0, "embed": 200.0, "io": 50.0}
PICK_WITHIN = 0.90  # tune's pick / the grid's best capacity
TIME_AT_MOST = 0.25  # tune's time / the grid's


@dataclass(frozen=True)
class GridShape:
    """How exhaustive the grid is, and how each point's capacity is searched."""

    name: str
    workers: tuple[str, ...]  # "1", "half", "cpus"
    batchings: tuple[tuple[int, float], ...]
    threads: tuple[int, ...]
    max_probes: int  # per capacity search
    resolution: float  # stop bisecting once highest missed / lowest met is within this
    seconds: float  # default seconds per probe


FULL = GridShape(
    "full", ("1", "half", "cpus"), ((1, 0.0), (8, 0.0), (32, 0.0), (32, 2.0)), (1, 4, 16, 32), 10, 1.1, 3.0
)
QUICK = GridShape("quick", ("cpus",), ((1, 0.0), (32, 2.0)), (4, 16), 6, 1.2, 1.0)


def grid(cpus: int, shape: GridShape = FULL, archs: tuple[str, ...] = ("sync", "async", "hybrid")) -> list[Variant]:
    """Every combination worth listing by hand, no pruning."""
    sizes = {"1": 1, "half": max(1, cpus // 2), "cpus": cpus}
    workers = sorted({sizes[w] for w in shape.workers})
    points: list[Variant] = []
    for count in workers:
        for batch, delay in shape.batchings:
            for threads in shape.threads:
                points.append(
                    Variant(
                        "sync",
                        {"workers": count, "threads": threads, "max_batch_size": batch, "max_batch_delay_ms": delay},
                    )
                )
            points.append(Variant("async", {"workers": count, "max_batch_size": batch, "max_batch_delay_ms": delay}))
            points.append(
                Variant(
                    "hybrid",
                    {"workers": 1, "model_workers": count, "max_batch_size": batch, "max_batch_delay_ms": delay},
                )
            )
    return [p for p in points if p.arch in archs]


@dataclass
class Capacity:
    variant: Variant
    rate: float  # highest rate that met the goal (0: none did)
    p95_ms: float | None
    probes: int
    trail: list[str]  # every probe's rate and outcome, in order: "400+", "800- (p95 61.2 ms > 50)"


def capacity(
    servers: ProbeServers,
    request: TuneRequest,
    name: str,
    variant: Variant,
    seconds: float,
    start: float,
    shape: GridShape = FULL,
) -> Capacity:
    """Double/halve from `start` until met and missed are bracketed, then bisect to the shape's resolution, at
    most its probes (not counting repeats).

    A miss is repeated once before it counts: a single slow probe (a stall of the shared machine, the load
    generator's own hiccup) would otherwise set the point's ceiling. The full grid on io read 92 req/s for a point
    that served 1,131 without the delay, after one missed first probe (docs/tuning.md)."""
    goal = request.goal
    met: dict[float, ProbeResult] = {}
    missed: list[float] = []
    trail: list[str] = []
    rate = start
    probes = 0
    for _ in range(shape.max_probes):
        rate = round(rate, 2)
        for _attempt in range(2):
            result = measure_probe(servers, Probe(variant, "grid", rate, seconds), name, request, probes)
            probes += 1
            ok, why = meets(result, goal)
            trail.append(f"{rate:g}{'+' if ok else '-'}" + ("" if ok else f" ({why})"))
            if ok:
                met[rate] = result
                break
            if result.failed is not None:  # the server did not start: a repeat would not either
                missed.append(rate)
                break
        else:
            missed.append(rate)
        lo = max(met, default=None)
        hi = min((m for m in missed if lo is None or m > lo), default=None)
        if lo is not None and hi is not None:
            if hi / lo <= shape.resolution:
                break
            rate = math.sqrt(lo * hi)
        elif lo is not None:
            rate = lo * 2
        elif hi is not None and hi / 2 >= 1.0:
            rate = hi / 2
        else:
            break
    servers.close()
    best = max(met, default=None)
    return Capacity(variant, best or 0.0, met[best].p95_ms if best else None, probes, trail)


@contextlib.contextmanager
def example_env(example: str) -> Iterator[None]:
    if example != "io":
        yield
        return
    from twinserve.examples.io import populate

    redis = RedisServer()
    try:
        populate(redis.url)
        os.environ["TWINSERVE_REDIS_URL"] = redis.url  # the probe servers inherit it
        yield
    finally:
        redis.stop()


def run_example(
    example: str, goal: Goal, seconds: float, cpus: int, shape: GridShape, archs: tuple[str, ...]
) -> dict[str, object]:
    model = EXAMPLES[example]
    name, bodies = model_bodies(model)
    request = TuneRequest(model, goal, budget_s=0, bodies=bodies, archs=archs, min_probe_s=seconds)
    servers = ProbeServers(request)
    # Every grid point's capacity search starts at 100 req/s, or lower for a model whose processes cannot do 100
    # even one request at a time (MiniLM): then the search's few probes are spent near its capacity.
    start = min(100.0, 0.5 * cpus * measure_facts(request, cpus).rows_per_s(1))
    started = time.monotonic()
    measured = []
    for point in grid(cpus, shape, archs):
        found = capacity(servers, request, name, point, seconds, start=start, shape=shape)
        measured.append(found)
        print(f"  grid {point.label:<64} {found.rate:>8,.1f} req/s  p95 {found.p95_ms or 0:6.1f} ms", flush=True)
        print(f"       {', '.join(found.trail)}", flush=True)
    grid_s = time.monotonic() - started
    best = max(measured, key=lambda c: c.rate)

    tune_started = time.monotonic()
    tune_request = TuneRequest(
        model, goal, budget_s=TIME_AT_MOST * grid_s, bodies=bodies, archs=archs, min_probe_s=seconds
    )
    tuned = run_tune(tune_request, name, cpus)
    tune_s = time.monotonic() - tune_started
    winner = tuned.decision.winner
    pick = (
        capacity(servers, request, name, winner.candidate, seconds, start=max(winner.rate, 1.0), shape=shape)
        if winner is not None
        else None
    )
    # The same point measured twice by the same method differs (io: 1,131 then 985 req/s): where tune picked a
    # point of the grid, the grid's own reading of it is the like-for-like comparison with the grid's best.
    in_grid = next((c.rate for c in measured if winner is not None and c.variant.label == winner.candidate.label), None)
    if pick is not None:
        print(f"  pick {pick.variant.label:<64} {pick.rate:>8,.1f} req/s  p95 {pick.p95_ms or 0:6.1f} ms", flush=True)
        print(f"       {', '.join(pick.trail)}", flush=True)
    return {
        "example": example,
        "pick": winner.candidate.label if winner else "none",
        "pick_rps": pick.rate if pick else 0.0,
        "pick_p95_ms": pick.p95_ms if pick else None,
        "pick_grid_rps": in_grid,
        "best": best.variant.label,
        "best_rps": best.rate,
        "best_p95_ms": best.p95_ms,
        "tune_s": tune_s,
        "grid_s": grid_s,
        "too_noisy": tuned.decision.too_noisy,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", default="tabular,embed,io")
    parser.add_argument("--slo-p95-ms", type=float, help="the P95 objective of every example (default: per example)")
    parser.add_argument(
        "--seconds", type=float, help="seconds per grid probe (and tune's rung 0); default 3, or 1 with --quick"
    )
    parser.add_argument("--quick", action="store_true", help="the affordable check: a smaller grid, shorter probes")
    parser.add_argument("--archs", default="sync,async,hybrid", help="architectures of the grid and of tune")
    args = parser.parse_args()
    shape = QUICK if args.quick else FULL
    seconds = args.seconds or shape.seconds
    archs = tuple(args.archs.split(","))
    cpus = usable_cores()
    rows = []
    for example in args.examples.split(","):
        goal = Goal(args.slo_p95_ms or SLO_P95_MS[example])
        points = len(grid(cpus, shape, archs))
        print(f"{example}: {shape.name} grid of {points} points, then tune; P95 objective {goal.slo_p95_ms:g} ms")
        with example_env(example):
            rows.append(run_example(example, goal, seconds, cpus, shape, archs))
    print()
    print(f"{'example':<8} {'tune pick':<58} {'req/s':>8} {'p95':>6} {'grid best':<58} {'req/s':>8} {'p95':>6} "
          f"{'tune s':>7} {'grid s':>7} {'pick/best':>9} {'time':>6}")  # fmt: skip
    ok = True
    for r in rows:
        ratio = float(r["pick_rps"]) / float(r["best_rps"]) if r["best_rps"] else 0.0  # type: ignore[arg-type]
        share = float(r["tune_s"]) / float(r["grid_s"])  # type: ignore[arg-type]
        ok = ok and ratio >= PICK_WITHIN and share <= TIME_AT_MOST
        print(
            f"{r['example']:<8} {r['pick']:<58} {r['pick_rps']:>8,.1f} {r['pick_p95_ms'] or 0:>6.1f} "
            f"{r['best']:<58} {r['best_rps']:>8,.1f} {r['best_p95_ms'] or 0:>6.1f} {r['tune_s']:>7.0f} "
            f"{r['grid_s']:>7.0f} {ratio:>9.2f} {share:>6.2f}" + ("  (too noisy to decide)" if r["too_noisy"] else "")
        )
    print(f"\npick within {PICK_WITHIN:.0%} of the best and at most {TIME_AT_MOST:.0%} of its time: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
