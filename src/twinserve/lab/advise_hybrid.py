"""Why hybrid trails async for this model, from what the bench measured (issue #15: within 10%, or say why).

Hybrid runs predict in model-worker processes; async in a thread of the server process. Both batch alike, so for
the same model the difference is what hybrid adds per batch: pickling the batch and its outputs, a pipe each
way, a worker's wake-up, and a second process's share of the cores. Two measurements show it:

- CPU per request at each architecture's best level within the SLO: the whole process tree's CPU (percent of one
  core) over its throughput. Hybrid's extra microseconds are the hop's cost in CPU; on a machine whose cores the
  model already fills, they come out of the model's own time.
- Time per batch as the server timed it (`twinserve_inference_duration_seconds` over the level, with its batch
  sizes): in hybrid it runs from handing the batch to a worker until its outputs are back, so against async's
  (the model in a thread) at a similar batch size, the difference is the hop's wall time. The in-process
  ceiling at that batch size is the model alone.

Nothing here is a guess: a line is written only for the measurements present, and none when hybrid is within
`GAP` of async or either never met the SLO.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from twinserve.lab.results import Ceiling, Level

if TYPE_CHECKING:
    from twinserve.lab.advise import Option

__all__ = ["GAP", "hybrid_trails"]

#: Hybrid is explained once its capacity is below async's by more than this share (the issue's 10%).
GAP = 0.10


def _cpu_us_per_request(level: Level) -> float | None:
    if level.resources is None or level.throughput_rps <= 0:
        return None
    return level.resources.cpu_percent_mean / 100 / level.throughput_rps * 1e6


def _in_process_ms(ceiling: Sequence[Ceiling], batch: float) -> float | None:
    """The model's own time for a batch of `batch` rows (a mean, so fractional), interpolated between the batch
    sizes measured in-process; None outside them."""
    known = sorted((c.batch_size, c.batch_ms_median) for c in ceiling if c.threads is None)
    for (b0, ms0), (b1, ms1) in itertools.pairwise(known):
        if b0 <= batch <= b1:
            return ms0 + (ms1 - ms0) * (batch - b0) / (b1 - b0)
    if known and batch == known[0][0]:
        return known[0][1]
    return None


def hybrid_trails(options: Sequence[Option], ceiling: Sequence[Ceiling]) -> list[str]:
    """Lines explaining, from the measurements, why the best hybrid run served less than the best async run at the
    SLO; none when it did not trail by more than GAP."""
    asyn, hybrid = (
        max((o for o in options if o.run.arch == arch), key=lambda o: o.capacity, default=None)
        for arch in ("async", "hybrid")
    )
    if asyn is None or hybrid is None or hybrid.capacity >= (1 - GAP) * asyn.capacity:
        return []
    lines = [
        f"Why {hybrid.run.label} trails {asyn.run.label} ({hybrid.capacity:,.0f} against {asyn.capacity:,.0f} "
        f"req/s, {1 - hybrid.capacity / asyn.capacity:.0%} less): hybrid hands each batch to a model-worker "
        "process and back (pickle, a pipe each way, a wake-up); async computes it in a thread of the server."
    ]
    cpu_h, cpu_a = _cpu_us_per_request(hybrid.level), _cpu_us_per_request(asyn.level)
    if cpu_h is not None and cpu_a is not None:
        lines.append(
            f"  CPU per request: {cpu_h:,.0f} µs in hybrid, {cpu_a:,.0f} µs in async "
            f"({cpu_h - cpu_a:+,.0f} µs; the whole process tree's CPU over its throughput at those levels)."
        )
    stats_h, stats_a = hybrid.level.server, asyn.level.server
    if stats_h and stats_a and stats_h.inference_ms_mean is not None and stats_a.inference_ms_mean is not None:
        size_h, size_a = stats_h.batch_size_mean or 1.0, stats_a.batch_size_mean or 1.0
        per_row_h, per_row_a = stats_h.inference_ms_mean / size_h, stats_a.inference_ms_mean / size_a
        alone = _in_process_ms(ceiling, size_h)
        model = f"; the model alone, in-process: {alone:.2f} ms" if alone is not None else ""
        lines.append(
            f"  Per batch, as the server timed it: {stats_h.inference_ms_mean:.2f} ms for {size_h:.1f} rows in "
            f"hybrid ({per_row_h:.3f} ms a row), {stats_a.inference_ms_mean:.2f} ms for {size_a:.1f} rows in "
            f"async ({per_row_a:.3f} ms a row){model}."
        )
    return lines
