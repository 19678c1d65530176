"""The report's figures reduced to plain data (`Plot` → `Panel` → `Series` → `Point`), for every renderer to draw.

Also the looks they share: the run palette, percentile line styles, axis labels and when an axis goes log-scale.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from twinserve.lab.report.rows import format_errors, format_load, format_ms, format_number, ordered_levels
from twinserve.lab.results import Level, Results

__all__ = ["MODE_AXIS", "PERCENTILE_STYLES", "Panel", "Plot", "Point", "Series", "build_plots", "log_scaled"]

_Mode = Literal["closed", "open"]
_PlotKey = Literal["throughput", "latency", "memory", "cpu", "errors"]

_PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#8C564B", "#7F7F7F", "#BCBD22")
_LOG_SPAN = 8.0  # a load axis spanning more than this factor is drawn log-scale
_LOG_Y_SPAN = 50.0  # latencies spanning more than this factor are drawn log-scale
PERCENTILE_STYLES = (("p50", ":", "1.5 3"), ("p95", "-", ""), ("p99", "--", "6 3"))  # name, matplotlib, SVG dasharray
MODE_AXIS = {"closed": "connections (closed loop)", "open": "offered load, req/s (open loop)"}


@dataclass(frozen=True)
class Point:
    """One level on a plot: where it is drawn, its hover text, and its marks."""

    x: float
    y: float
    title: str
    errors: bool
    generator_limited: bool


@dataclass(frozen=True)
class Series:
    """One run's line on a panel (one line per percentile in the latency plot)."""

    name: str  # the run label
    color: str
    points: list[Point]
    style: str = "p95"  # which PERCENTILE_STYLES line style (latency only)


@dataclass(frozen=True)
class Panel:
    """One mode's panel of a plot: closed-loop levels by connections, open-loop ones by offered rate."""

    mode: _Mode
    series: list[Series]

    @property
    def xs(self) -> list[float]:
        return sorted({p.x for s in self.series for p in s.points})

    @property
    def ys(self) -> list[float]:
        return [p.y for s in self.series for p in s.points]


@dataclass(frozen=True)
class Plot:
    """One figure: a metric over load, a panel per mode measured."""

    key: _PlotKey
    title: str
    y_label: str
    panels: list[Panel]
    slo: float | None = None
    styles: bool = False  # the series differ by line style (percentiles) as well as colour
    log_y: bool = False
    y_suffix: str = ""  # after each y tick's number: "%" where the values are percentages

    def y_tick(self, value: float) -> str:
        return format_number(value) + self.y_suffix


_Metric = Callable[[Level], list[tuple[str, float, str]]]  # level → [(style, y, metric text)]


def _throughput(lv: Level) -> list[tuple[str, float, str]]:
    return [("p95", lv.throughput_rps, f"p95 {format_ms(lv.p('p95'))} ms")]


def _latency(lv: Level) -> list[tuple[str, float, str]]:
    return [(name, v, f"{name} {format_ms(v)} ms") for name, _, _ in PERCENTILE_STYLES if (v := lv.p(name)) is not None]


def _memory(lv: Level) -> list[tuple[str, float, str]]:
    if (res := lv.resources) is None:
        return []
    rss = f" (RSS summed {res.rss_mib_max:,.0f} MiB)" if res.pss_mib_max is not None else ""
    processes = f"{res.processes} process{'' if res.processes == 1 else 'es'}"
    roles = f": {res.roles_text()}" if res.per_process else ""
    return [("p95", res.memory_mib, f"{res.memory_basis} max {res.memory_mib:,.0f} MiB{rss} · {processes}{roles}")]


def _cpu(lv: Level) -> list[tuple[str, float, str]]:
    if (res := lv.resources) is None:
        return []
    text = f"CPU {res.cpu_percent_mean:,.0f}% of one core (max {res.cpu_percent_max:,.0f}%)"
    return [("p95", res.cpu_percent_mean, text)]


def _error_rate(lv: Level) -> list[tuple[str, float, str]]:
    return [("p95", 100 * lv.error_rate, f"error rate {lv.error_rate:.2%} ({lv.errors:,} of {lv.sent:,})")]


def _panels(results: Results, metric: _Metric) -> list[Panel]:
    panels = []
    for mode in ("closed", "open"):
        series: dict[tuple[int, str], list[Point]] = {}
        for index, run in enumerate(results.runs):
            for lv in ordered_levels(lv for lv in run.levels if lv.mode == mode):
                flags = (" · generator-limited" if lv.generator_limited else "") + (
                    f" · errors {format_errors(lv)}" if lv.errors else ""
                )
                base = f"{run.label} · {format_load(lv, offered='offered ')} · {lv.throughput_rps:,.0f} req/s"
                for style, y, text in metric(lv):
                    point = Point(lv.load, y, f"{base} · {text}{flags}", lv.errors > 0, lv.generator_limited)
                    series.setdefault((index, style), []).append(point)
        if series:
            runs = results.runs
            panels.append(
                Panel(
                    mode,
                    [
                        Series(runs[i].label, _PALETTE[i % len(_PALETTE)], points, style)
                        for (i, style), points in series.items()
                    ],
                )
            )
    return panels


def build_plots(results: Results) -> list[Plot]:
    """Every figure of the report, as data: throughput, latency, memory, CPU and error rate."""
    latency = _panels(results, _latency)
    ys = [y for panel in latency for y in panel.ys if y > 0]
    return [
        Plot("throughput", "Throughput", "req/s", _panels(results, _throughput)),
        Plot(
            "latency",
            "Latency P50 / P95 / P99",
            "ms",
            latency,
            slo=results.slo_p95_ms,
            styles=True,
            log_y=bool(ys) and max(ys) / min(ys) > _LOG_Y_SPAN,
        ),
        Plot("memory", "Memory (peak PSS of the server's process tree)", "MiB", _panels(results, _memory)),
        Plot("cpu", "CPU (mean, % of one core)", "% of one core", _panels(results, _cpu)),
        # Percent on the values and on every tick (0.5%), so the scale reads as its label says even where no level
        # had errors and the axis spans 0-1%.
        Plot("errors", "Error rate", "% of requests", _panels(results, _error_rate), y_suffix="%"),
    ]


def log_scaled(xs: Sequence[float]) -> bool:
    """Whether a load axis over `xs` is drawn log-scale: it spans too wide a range to read linearly."""
    return bool(xs) and min(xs) > 0 and max(xs) / min(xs) > _LOG_SPAN
