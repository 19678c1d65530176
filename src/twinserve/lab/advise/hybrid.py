"""Why hybrid trails async for this model, from what the bench measured: it should come close, or say why.

Both batch alike, so the difference is what hybrid adds per batch (pickling, a pipe each way, a worker's wake-up,
more processes sharing the cores). At one load both measured, it compares CPU per request (the process tree's CPU
over throughput: hybrid's hop in CPU) and time per batch as each server timed it, against the in-process ceiling
as the floor: slower batches at no more CPU per request mean hybrid waits, not works. A line is written only for
the measurements present, and none when hybrid is within `GAP` of async or either never met the SLO.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from twinserve.lab.ceiling import curve
from twinserve.lab.options import Option
from twinserve.lab.results import Ceiling, Level

__all__ = ["GAP", "hybrid_trails"]

#: Hybrid is explained once its capacity is below async's by more than this share.
GAP = 0.10


def _cpu_us_per_request(level: Level) -> float | None:
    if level.resources is None or level.throughput_rps <= 0:
        return None
    return level.resources.cpu_percent_mean / 100 / level.throughput_rps * 1e6


def _in_process_ms(ceiling: Sequence[Ceiling], batch: float) -> float | None:
    """The model's own time for a batch of `batch` rows (a mean, so fractional), on as many math threads as it
    was let use, interpolated between the batch sizes measured in-process; None outside them."""
    known = sorted((c.batch_size, c.batch_ms_median) for c in curve(ceiling)) if ceiling else []
    for (b0, ms0), (b1, ms1) in itertools.pairwise(known):
        if b0 <= batch <= b1:
            return ms0 + (ms1 - ms0) * (batch - b0) / (b1 - b0)
    if known and batch == known[0][0]:
        return known[0][1]
    return None


def _same_load(run_levels: Sequence[Level], level: Level) -> Level | None:
    return next((lv for lv in run_levels if lv.mode == level.mode and lv.load == level.load), None)


def hybrid_trails(options: Sequence[Option], ceiling: Sequence[Ceiling]) -> list[str]:
    """Lines explaining, from the measurements, why the best hybrid run served less than the best async run at the
    SLO; none when it did not trail by more than GAP."""
    asyn, hybrid = (
        max((o for o in options if o.run.arch == arch), key=lambda o: o.capacity, default=None)
        for arch in ("async", "hybrid")
    )
    if asyn is None or hybrid is None or hybrid.capacity >= (1 - GAP) * asyn.capacity:
        return []
    h, a = hybrid.level, _same_load(asyn.run.levels, hybrid.level)
    if a is None or a.errors:
        a, where = asyn.level, "at each one's best level"
    else:
        where = f"at the same load ({h.load_text})"
    lines = [
        f"Why {hybrid.run.label} trails {asyn.run.label} ({hybrid.capacity:,.0f} against {asyn.capacity:,.0f} "
        f"req/s within the objective, {1 - hybrid.capacity / asyn.capacity:.0%} less), {where}:"
    ]
    p95_h, p95_a = h.p("p95"), a.p("p95")
    if p95_h is not None and p95_a is not None:
        lines.append(
            f"  P95 {p95_h:.1f} ms in hybrid, {p95_a:.1f} ms in async; "
            f"{h.throughput_rps:,.0f} and {a.throughput_rps:,.0f} req/s."
        )
    cpu_h, cpu_a = _cpu_us_per_request(h), _cpu_us_per_request(a)
    if cpu_h is not None and cpu_a is not None:
        why = (
            "the hop to a model-worker process and back (pickling, a pipe each way, wake-ups) costs CPU the model "
            "would otherwise use"
            if cpu_h > cpu_a
            else "hybrid spends no more CPU on a request: it waits (for a model worker, or for cores its extra "
            "processes share) rather than works"
        )
        lines.append(
            f"  CPU per request (the process tree's CPU over its throughput): {cpu_h:,.0f} µs in hybrid, "
            f"{cpu_a:,.0f} µs in async ({cpu_h - cpu_a:+,.0f} µs): {why}."
        )
    stats_h, stats_a = h.server, a.server
    if stats_h and stats_a and stats_h.inference_ms_mean is not None and stats_a.inference_ms_mean is not None:
        size_h, size_a = stats_h.batch_size_mean or 1.0, stats_a.batch_size_mean or 1.0
        alone = _in_process_ms(ceiling, size_h)
        model = (
            f"; the model alone in-process, on every core: {alone:.2f} ms for {size_h:.1f}" if alone is not None else ""
        )
        lines.append(
            f"  Per batch, as each server timed it: {stats_h.inference_ms_mean:.2f} ms for {size_h:.1f} rows in "
            f"hybrid ({stats_h.inference_ms_mean / size_h:.3f} ms a row), {stats_a.inference_ms_mean:.2f} ms for "
            f"{size_a:.1f} in async ({stats_a.inference_ms_mean / size_a:.3f} ms a row){model}."
        )
    return lines
