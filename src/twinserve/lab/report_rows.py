"""The report's numbers as text, and the summary table's rows (`_Row`), which the HTML and terminal tables share."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from twinserve.lab.results import Level, Results

__all__ = ["_COLUMNS", "_NUMERIC", "_UNITS", "_Row", "_errors_text", "_load_text", "_ms", "_num", "_ordered", "_rows"]


# ---------------------------------------------------------------- formatting


def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 or v == int(v) else f"{v:.3g}"


def _ms(v: float | None) -> str:
    return "—" if v is None else (f"{v:,.1f}" if v >= 1 else f"{v:.2f}")


def _load_text(level: Level, *, offered: str = "") -> str:
    if level.mode == "closed":
        return f"{level.concurrency or 0:,} conn{'' if level.concurrency == 1 else 's'}"
    return f"{offered}{_num(level.load)} req/s"


def _errors_text(level: Level) -> str:
    # By status and the server's error code ("503 queue_full") where the driver read them (twinserve's own).
    kinds = {**(level.http_error_codes or level.http_errors), **level.transport_errors}
    detail = ", ".join(f"{kind}: {n:,}" for kind, n in sorted(kinds.items()) if n)
    return f"{level.errors:,} ({level.error_rate:.1%}) · {detail}" if level.errors else "0"


def _ordered(levels: Iterable[Level]) -> list[Level]:
    return sorted(levels, key=lambda lv: (lv.mode != "closed", lv.load))


# ---------------------------------------------------------------- table rows


@dataclass(frozen=True)
class _Row:
    run: int  # index into Results.runs
    cells: tuple[str, ...]
    errors: bool = False
    generator_limited: bool = False
    failed: bool = False


_COLUMNS = ("Run", "Load", "req/s", "p50", "p95", "p99", "Errors", "Mem MiB", "CPU %", "Notes")
_UNITS = (
    "Load: connections (closed loop) or offered req/s (open loop). Latency in ms; Mem is the peak PSS of the "
    "server's process tree (a page its processes share counted once); CPU is % of one core."
)
_NUMERIC = {2, 3, 4, 5, 7, 8}  # right-aligned columns


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
        notes.append(f"sent only {_num(level.achieved_rate)} req/s")
    p95 = level.p("p95")
    if slo is not None and p95 is not None and p95 > slo:
        notes.append("p95 over SLO")
    return "; ".join(notes)


def _rows(results: Results) -> list[_Row]:
    rows = []
    for index, run in enumerate(results.runs):
        for lv in _ordered(run.levels):
            res = lv.resources
            cells = (
                run.label,
                _load_text(lv),
                f"{lv.throughput_rps:,.0f}",
                _ms(lv.p("p50")),
                _ms(lv.p("p95")),
                _ms(lv.p("p99")),
                _errors_text(lv),
                "—" if res is None else f"{res.memory_mib:,.0f}",
                "—" if res is None else f"{res.cpu_percent_mean:,.0f}",
                _notes(lv, results.slo_p95_ms),
            )
            rows.append(_Row(index, cells, errors=lv.errors > 0, generator_limited=lv.generator_limited))
        if run.error:
            first_line = run.error.strip().splitlines()[0] if run.error.strip() else "no reason given"
            blank = ("—",) * (len(_COLUMNS) - 2)
            rows.append(_Row(index, (run.label, *blank, f"failed: {first_line}"), failed=True))
    return rows
