"""The article's claims (S12, S20, S21, S22), each tested on what `twinserve bench` measured.

Every verdict quotes the numbers it rests on and, for a claim with a magnitude, the measured one beside the
claimed one; where the runs cannot answer a claim it says which run is missing.
"""

from __future__ import annotations

import itertools
import statistics

from twinserve.lab.results import Level, Results, Run, Verdict

__all__ = ["ARTICLE", "SHORT_INFERENCE_MS", "SOURCES", "peak", "saturation", "verdicts"]

#: The article twinserve grew from; its points are numbered S1..S27 (docs/choosing.md lists the ones judged).
ARTICLE = "Async vs Sync Architecture for AI Model Serving"
#: The points the verdicts judge, as the article's checklist words them.
SOURCES = {
    "S12": "On GPU: CUDA streams; batching raises efficiency by up to 300%.",
    "S20": "Claims to verify by measurement: sync is more predictable below ~1000 req/s; async gives 5-10% lower "
    "latency and ~70% less memory.",
    "S21": "Study traffic patterns with Prometheus-like tools; set latency targets (e.g. P95 < 200 ms); check "
    "infrastructure compatibility.",
    "S22": "Measure inference time: short requests suit sync, long ones suit async.",
}

#: Where "short" inference ends for S22's rule; the article gives no number, so the verdict states the one used.
SHORT_INFERENCE_MS = 10.0


def _first(results: Results, arch: str) -> Run | None:
    """The run of `arch` with the default settings (the first one), if it was measured."""
    return next((r for r in results.runs if r.arch == arch and r.error is None and r.levels), None)


def _closed(run: Run) -> dict[int, Level]:
    return {lv.concurrency: lv for lv in run.levels if lv.mode == "closed" and lv.concurrency is not None}


def peak(run: Run) -> Level:
    clean = [lv for lv in run.levels if lv.errors == 0] or run.levels
    return max(clean, key=lambda lv: lv.throughput_rps)


def saturation(run: Run) -> Level | None:
    """The first level past which more load bought less than 10% more throughput, or errors appeared."""
    levels = sorted((lv for lv in run.levels if lv.mode == "closed"), key=lambda lv: lv.load)
    for previous, level in itertools.pairwise(levels):
        if level.errors or level.throughput_rps < previous.throughput_rps * 1.10:
            return previous
    return None


def _against(measured: float, low: float, high: float) -> str:
    """Where a measured fraction sits against a claimed range (one value: low == high, "~" within a tenth)."""
    if low == high:
        low, high = low - 0.1, high + 0.1
    if measured < low:
        return "less than claimed"
    if measured > high:
        return "more than claimed"
    return "as claimed"


def _lower_latency(sync: Run, asyn: Run) -> Verdict:
    claim, source = "async gives 5-10% lower latency than sync", "S20"
    common = sorted(set(_closed(sync)) & set(_closed(asyn)))
    if not common:
        return Verdict(claim=claim, source=source, holds=None, evidence="sync and async share no load level")
    n = common[0]
    s, a, load = _closed(sync)[n].p("p50"), _closed(asyn)[n].p("p50"), _closed(sync)[n].load_text
    if not s or not a:
        return Verdict(claim=claim, source=source, holds=None, evidence=f"no latency measured at {load}")
    change = (s - a) / s
    measured = f"{abs(change):.0%} {'lower' if change >= 0 else 'higher'}"
    return Verdict(
        claim=claim,
        source=source,
        holds=change >= 0.05,
        evidence=f"at {load} P50 is {a:.2f} ms async vs {s:.2f} ms sync: {measured} with async "
        f"({_against(change, 0.05, 0.10)})",
        claimed="5-10% lower",
        measured=measured,
    )


def _memory(sync: Run, asyn: Run) -> Verdict:
    """On each server's peak memory as the kernel holds it (PSS summed over the tree: a page the forked workers
    share counts once), with the processes by role, since memory follows the number of processes holding the
    model; a supervisor (gunicorn's arbiter) holds none."""
    claim, source = "async uses ~70% less memory than sync", "S20"

    def most(run: Run) -> Level | None:
        measured = [lv for lv in run.levels if lv.resources]
        return max(measured, key=lambda lv: lv.resources.memory_mib if lv.resources else 0.0, default=None)

    s_level, a_level = most(sync), most(asyn)
    if s_level is None or a_level is None or s_level.resources is None or a_level.resources is None:
        return Verdict(claim=claim, source=source, holds=None, evidence="no memory samples")
    s_res, a_res = s_level.resources, a_level.resources
    s, a = s_res.memory_mib, a_res.memory_mib
    if not s or not a:
        return Verdict(claim=claim, source=source, holds=None, evidence="no memory samples")
    basis = s_res.memory_basis if s_res.memory_basis == a_res.memory_basis else "RSS"
    if basis == "RSS":
        s, a = s_res.rss_mib_max, a_res.rss_mib_max
    saving = (s - a) / s
    measured = f"{abs(saving):.0%} {'less' if saving >= 0 else 'more'}"
    return Verdict(
        claim=claim,
        source=source,
        holds=saving >= 0.6,
        evidence=f"peak {basis} of the whole server {a:,.0f} MiB async vs {s:,.0f} MiB sync: {measured} with async "
        f"({_against(saving, 0.7, 0.7)}); by role: sync {s_res.roles_text()}; async {a_res.roles_text()}",
        claimed="~70% less",
        measured=measured,
    )


def _spread(level: Level) -> float | None:
    p50, p99 = level.p("p50"), level.p("p99")
    return p99 / p50 if p50 and p99 else None


def _predictable(sync: Run, asyn: Run) -> Verdict:
    claim, source = "sync is more predictable (tighter P99/P50) below its saturation point", "S20"
    knee = saturation(sync)
    limit = knee.load if knee is not None else max((lv.load for lv in sync.levels), default=0)
    pairs = [
        (_spread(s), _spread(_closed(asyn)[n]))
        for n, s in _closed(sync).items()
        if n <= limit and n in _closed(asyn) and s.errors == 0
    ]
    spreads = [(s, a) for s, a in pairs if s is not None and a is not None]
    if not spreads:
        return Verdict(claim=claim, source=source, holds=None, evidence="no common load below sync's saturation")
    s_med, a_med = statistics.median(s for s, _ in spreads), statistics.median(a for _, a in spreads)
    return Verdict(
        claim=claim,
        source=source,
        holds=s_med < a_med,
        evidence=f"median P99/P50 up to {limit:g} connections: sync {s_med:.2f}, async {a_med:.2f}",
    )


def _saturation(results: Results) -> Verdict:
    """S21 holds only once every run saturated within the measured loads: a run that never did has a saturation
    point past the run, so whether it differs from the others' cannot be told."""
    claim, source = "each architecture has its own saturation point (find it before choosing)", "S21"
    parts, points, unsaturated = [], [], []
    for run in results.runs:
        if run.error is not None or not run.levels:
            continue
        knee = saturation(run)
        top = peak(run)
        closed = sum(1 for lv in run.levels if lv.mode == "closed")
        if knee is not None:
            where = f"saturates from {knee.load:g} connections"
            points.append((knee.load, top.throughput_rps))
        else:
            where = "did not saturate" if closed > 1 else "was measured at one load only"
            unsaturated.append(run.label)
        parts.append(f"{run.label} {where}, peak {top.throughput_rps:,.0f} req/s")
    if not parts:
        return Verdict(claim=claim, source=source, holds=None, evidence="no runs")
    if unsaturated:
        missing = ", ".join(unsaturated)
        return Verdict(
            claim=claim,
            source=source,
            holds=None,
            evidence=f"{missing} did not saturate within the run (add higher --concurrency levels); "
            + "; ".join(parts),
        )
    # Saturated everywhere: the points differ if the knees sit at different loads or the peaks differ by > 10%.
    loads, peaks = {load for load, _ in points}, [rps for _, rps in points]
    differ = len(points) == 1 or len(loads) > 1 or max(peaks) > 1.10 * min(peaks)
    return Verdict(claim=claim, source=source, holds=differ, evidence="; ".join(parts))


def _batching(results: Results) -> Verdict:
    claim, source = "batching raises throughput by up to 300%", "S12"
    for arch in ("async", "hybrid", "sync"):
        runs = [r for r in results.runs if r.arch == arch and r.error is None and r.levels]
        off = [r for r in runs if r.settings.get("max_batch_size") == 1]
        on = [r for r in runs if int(r.settings.get("max_batch_size") or 0) > 1]
        if off and on:
            base = max(peak(r).throughput_rps for r in off)
            best = max(on, key=lambda r: peak(r).throughput_rps)
            gain = peak(best).throughput_rps / base - 1 if base else 0.0
            return Verdict(
                claim=claim,
                source=source,
                holds=gain > 0,
                evidence=f"{arch}: peak {peak(best).throughput_rps:,.0f} req/s with max batch "
                f"{best.settings.get('max_batch_size')} vs {base:,.0f} without batching ({gain:+.0%}, "
                f"{'more than' if gain > 3 else 'within'} the claimed up to +300%)",
                claimed="up to +300%",
                measured=f"{gain:+.0%}",
            )
    return Verdict(
        claim=claim,
        source=source,
        holds=None,
        evidence="needs runs with and without batching: add --max-batch-size 1,32",
    )


def _inference_rule(results: Results) -> Verdict:
    claim, source = "short inference suits sync, long inference suits async", "S22"
    one = next((c for c in results.ceiling if c.batch_size == 1), None)
    sync = _first(results, "sync")
    others = [r for r in results.runs if r.arch != "sync" and r.error is None and r.levels]
    if one is None or sync is None or not others:
        return Verdict(claim=claim, source=source, holds=None, evidence="needs the in-process timing, sync and async")
    best = max(others, key=lambda r: peak(r).throughput_rps)
    short = one.batch_ms_median < SHORT_INFERENCE_MS
    sync_wins = peak(sync).throughput_rps >= peak(best).throughput_rps
    return Verdict(
        claim=claim,
        source=source,
        holds=sync_wins == short,
        evidence=f"one instance takes {one.batch_ms_median:.2f} ms in-process ({'short' if short else 'long'}: "
        f"< {SHORT_INFERENCE_MS:g} ms counts as short); peak sync {peak(sync).throughput_rps:,.0f} req/s vs "
        f"{best.label} {peak(best).throughput_rps:,.0f} req/s",
    )


def verdicts(results: Results) -> list[Verdict]:
    sync, asyn = _first(results, "sync"), _first(results, "async")
    found: list[Verdict] = []
    if sync is not None and asyn is not None:
        found += [_lower_latency(sync, asyn), _memory(sync, asyn), _predictable(sync, asyn)]
    found += [_saturation(results), _batching(results), _inference_rule(results)]
    return found
