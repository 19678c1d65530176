"""The report's numbers as text, and the summary table's rows (`SummaryRow`), which the HTML and terminal tables
share."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from twinserve.lab.results import Level, Results

__all__ = [
    "COLUMNS",
    "NUMERIC_COLUMNS",
    "UNITS",
    "SummaryRow",
    "format_errors",
    "format_load",
    "format_ms",
    "format_number",
    "ordered_levels",
    "summary_rows",
]


# ---------------------------------------------------------------- formatting


def format_number(v: float) -> str:
    """A count or rate as the report prints it: whole with thousands separators, or three significant digits."""
    return f"{v:,.0f}" if abs(v) >= 100 or v == int(v) else f"{v:.3g}"


def format_ms(v: float | None) -> str:
    """Milliseconds as the report prints them; a dash where nothing was measured."""
    return "—" if v is None else (f"{v:,.1f}" if v >= 1 else f"{v:.2f}")


def format_load(level: Level, *, offered: str = "") -> str:
    """A level's load: its connections (closed loop) or its rate (open loop, after `offered`)."""
    if level.mode == "closed":
        return f"{level.concurrency or 0:,} conn{'' if level.concurrency == 1 else 's'}"
    return f"{offered}{format_number(level.load)} req/s"


def format_errors(level: Level) -> str:
    """A level's errors: how many, their share, and each kind's count."""
    # By status and the server's error code ("503 queue_full") where the driver read them (twinserve's own).
    kinds = {**(level.http_error_codes or level.http_errors), **level.transport_errors}
    detail = ", ".join(f"{kind}: {n:,}" for kind, n in sorted(kinds.items()) if n)
    return f"{level.errors:,} ({level.error_rate:.1%}) · {detail}" if level.errors else "0"


def ordered_levels(levels: Iterable[Level]) -> list[Level]:
    """Closed-loop levels first, each mode by load."""
    return sorted(levels, key=lambda lv: (lv.mode != "closed", lv.load))


# ---------------------------------------------------------------- table rows


@dataclass(frozen=True)
class SummaryRow:
    """One row of the summary table: a level of a run, or a run that failed."""

    run: int  # index into Results.runs
    cells: tuple[str, ...]
    errors: bool = False
    generator_limited: bool = False
    failed: bool = False


COLUMNS = ("Run", "Load", "req/s", "p50", "p95", "p99", "Errors", "Mem MiB", "CPU %", "Notes")
UNITS = (
    "Load: connections (closed loop) or offered req/s (open loop). Latency in ms; Mem is the peak PSS of the "
    "server's process tree (a page its processes share counted once); CPU is % of one core."
)
NUMERIC_COLUMNS = {2, 3, 4, 5, 7, 8}  # right-aligned columns


def _notes(level: Level, slo: float | None) -> str:
    notes = []
    if level.generator_limited:
        notes.append("generator-limited")
    if level.pool_exhausted:
        notes.append("connection pool exhausted")
    if (
        level.mode == "open"
        and level.rate
        and level.achieved_rate is not None
        and level.achieved_rate < 0.95 * level.rate
    ):
        notes.append(f"sent only {format_number(level.achieved_rate)} req/s")
    p95 = level.p("p95")
    if slo is not None and p95 is not None and p95 > slo:
        notes.append("p95 over SLO")
    return "; ".join(notes)


def summary_rows(results: Results) -> list[SummaryRow]:
    """Every run's levels in order, and a row for each run that failed."""
    rows = []
    for index, run in enumerate(results.runs):
        for lv in ordered_levels(run.levels):
            res = lv.resources
            cells = (
                run.label,
                format_load(lv),
                f"{lv.throughput_rps:,.0f}",
                format_ms(lv.p("p50")),
                format_ms(lv.p("p95")),
                format_ms(lv.p("p99")),
                format_errors(lv),
                "—" if res is None else f"{res.memory_mib:,.0f}",
                "—" if res is None else f"{res.cpu_percent_mean:,.0f}",
                _notes(lv, results.slo_p95_ms),
            )
            rows.append(SummaryRow(index, cells, errors=lv.errors > 0, generator_limited=lv.generator_limited))
        if run.error:
            first_line = run.error.strip().splitlines()[0] if run.error.strip() else "no reason given"
            blank = ("—",) * (len(COLUMNS) - 2)
            rows.append(SummaryRow(index, (run.label, *blank, f"failed: {first_line}"), failed=True))
    return rows
