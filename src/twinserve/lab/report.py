"""Turn a `Results` into a report: one offline HTML file with hoverable SVG plots, PNG plots, and a terminal table.

The figures are first reduced to plain data (`_Plot` → `_Panel` → `_Series` → `_Point`, and `_Row` for tables);
the SVG, PNG, HTML and rich renderers only draw that data, so every output shows the same numbers.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rich import box
from rich.console import Console
from rich.table import Table

from twinserve.lab.results import Level, Results

__all__ = ["print_summary", "summary_table", "write_report"]

_Mode = Literal["closed", "open"]
_PlotKey = Literal["throughput", "latency", "memory", "cpu", "errors"]

_PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#8C564B", "#7F7F7F", "#BCBD22")
_ERROR_COLOR = "#D62728"
_LOG_SPAN = 8.0  # a load axis spanning more than this factor is drawn log-scale
_LOG_Y_SPAN = 50.0  # latencies spanning more than this factor are drawn log-scale
_PERCENTILES = (("p50", ":", "1.5 3"), ("p95", "-", ""), ("p99", "--", "6 3"))  # name, matplotlib, SVG dasharray
_MODE_AXIS = {"closed": "connections (closed loop)", "open": "offered load, req/s (open loop)"}


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
    kinds = {**level.http_errors, **level.transport_errors}
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


_COLUMNS = ("Run", "Load", "req/s", "p50", "p95", "p99", "Errors", "RSS MiB", "CPU %", "Notes")
_UNITS = (
    "Load: connections (closed loop) or offered req/s (open loop). Latency in ms; RSS is the maximum of the "
    "server's process tree; CPU is % of one core."
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
                "—" if res is None else f"{res.rss_mib_max:,.0f}",
                "—" if res is None else f"{res.cpu_percent_mean:,.0f}",
                _notes(lv, results.slo_p95_ms),
            )
            rows.append(_Row(index, cells, errors=lv.errors > 0, generator_limited=lv.generator_limited))
        if run.error:
            first_line = run.error.strip().splitlines()[0] if run.error.strip() else "no reason given"
            blank = ("—",) * (len(_COLUMNS) - 2)
            rows.append(_Row(index, (run.label, *blank, f"failed: {first_line}"), failed=True))
    return rows


# ---------------------------------------------------------------- plot data


@dataclass(frozen=True)
class _Point:
    x: float
    y: float
    title: str
    errors: bool
    generator_limited: bool


@dataclass(frozen=True)
class _Series:
    name: str  # the run label
    color: str
    points: list[_Point]
    style: str = "p95"  # which _PERCENTILES line style (latency only)


@dataclass(frozen=True)
class _Panel:
    mode: _Mode
    series: list[_Series]

    @property
    def xs(self) -> list[float]:
        return sorted({p.x for s in self.series for p in s.points})

    @property
    def ys(self) -> list[float]:
        return [p.y for s in self.series for p in s.points]


@dataclass(frozen=True)
class _Plot:
    key: _PlotKey
    title: str
    y_label: str
    panels: list[_Panel]
    slo: float | None = None
    styles: bool = False  # the series differ by line style (percentiles) as well as colour
    log_y: bool = False


_Metric = Callable[[Level], list[tuple[str, float, str]]]  # level → [(style, y, metric text)]


def _throughput(lv: Level) -> list[tuple[str, float, str]]:
    return [("p95", lv.throughput_rps, f"p95 {_ms(lv.p('p95'))} ms")]


def _latency(lv: Level) -> list[tuple[str, float, str]]:
    return [(name, v, f"{name} {_ms(v)} ms") for name, _, _ in _PERCENTILES if (v := lv.p(name)) is not None]


def _memory(lv: Level) -> list[tuple[str, float, str]]:
    if (res := lv.resources) is None:
        return []
    uss = "" if res.uss_mib_max is None else f" · USS max {res.uss_mib_max:,.0f} MiB"
    processes = f"{res.processes} process{'' if res.processes == 1 else 'es'}"
    return [("p95", res.rss_mib_max, f"RSS max {res.rss_mib_max:,.0f} MiB{uss} · {processes}")]


def _cpu(lv: Level) -> list[tuple[str, float, str]]:
    if (res := lv.resources) is None:
        return []
    text = f"CPU {res.cpu_percent_mean:,.0f}% of one core (max {res.cpu_percent_max:,.0f}%)"
    return [("p95", res.cpu_percent_mean, text)]


def _error_rate(lv: Level) -> list[tuple[str, float, str]]:
    return [("p95", 100 * lv.error_rate, f"error rate {lv.error_rate:.2%} ({lv.errors:,} of {lv.sent:,})")]


def _panels(results: Results, metric: _Metric) -> list[_Panel]:
    panels = []
    for mode in ("closed", "open"):
        series: dict[tuple[int, str], list[_Point]] = {}
        for index, run in enumerate(results.runs):
            for lv in _ordered(lv for lv in run.levels if lv.mode == mode):
                flags = (" · generator-limited" if lv.generator_limited else "") + (
                    f" · errors {_errors_text(lv)}" if lv.errors else ""
                )
                base = f"{run.label} · {_load_text(lv, offered='offered ')} · {lv.throughput_rps:,.0f} req/s"
                for style, y, text in metric(lv):
                    point = _Point(lv.load, y, f"{base} · {text}{flags}", lv.errors > 0, lv.generator_limited)
                    series.setdefault((index, style), []).append(point)
        if series:
            runs = results.runs
            panels.append(
                _Panel(
                    mode,
                    [
                        _Series(runs[i].label, _PALETTE[i % len(_PALETTE)], points, style)
                        for (i, style), points in series.items()
                    ],
                )
            )
    return panels


def _plots(results: Results) -> list[_Plot]:
    latency = _panels(results, _latency)
    ys = [y for panel in latency for y in panel.ys if y > 0]
    return [
        _Plot("throughput", "Throughput", "req/s", _panels(results, _throughput)),
        _Plot(
            "latency",
            "Latency P50 / P95 / P99",
            "ms",
            latency,
            slo=results.slo_p95_ms,
            styles=True,
            log_y=bool(ys) and max(ys) / min(ys) > _LOG_Y_SPAN,
        ),
        _Plot("memory", "Memory (RSS max of the server's process tree)", "MiB", _panels(results, _memory)),
        _Plot("cpu", "CPU (mean, % of one core)", "% of one core", _panels(results, _cpu)),
        _Plot("errors", "Error rate", "% of requests", _panels(results, _error_rate)),
    ]


def _log_x(xs: Sequence[float]) -> bool:
    return bool(xs) and min(xs) > 0 and max(xs) / min(xs) > _LOG_SPAN


# ---------------------------------------------------------------- PNG (matplotlib, no pyplot global state)


def _write_png(plot: _Plot, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, NullLocator

    n = max(len(plot.panels), 1)
    fig = Figure(figsize=(6.2 * n, 4.4), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle(plot.title, fontweight="bold")
    axes = fig.subplots(1, n, squeeze=False)[0]
    runs: dict[str, Line2D] = {}
    marks: dict[str, Line2D] = {}
    dash = {name: mpl for name, mpl, _ in _PERCENTILES}
    for ax, panel in zip(axes, plot.panels, strict=False):
        for s in panel.series:
            xs, ys = [p.x for p in s.points], [p.y for p in s.points]
            ax.plot(xs, ys, dash[s.style] if plot.styles else "-", color=s.color, marker="o", markersize=4)
            runs.setdefault(_mpl_text(s.name), Line2D([], [], color=s.color, marker="o", markersize=4))
            if gl := [p for p in s.points if p.generator_limited]:
                ax.scatter([p.x for p in gl], [p.y for p in gl], s=110, marker="D", facecolors="none", edgecolors="k")
                marks["generator-limited"] = Line2D([], [], ls="", marker="D", mfc="none", mec="k")
            if err := [p for p in s.points if p.errors]:
                ax.scatter([p.x for p in err], [p.y for p in err], s=150, facecolors="none", edgecolors=_ERROR_COLOR)
                marks["with errors"] = Line2D([], [], ls="", marker="o", ms=9, mfc="none", mec=_ERROR_COLOR)
        top = max([*panel.ys, plot.slo or 0.0])
        if plot.slo is not None:
            ax.axhline(plot.slo, color=_ERROR_COLOR, lw=1, ls=(0, (4, 3)))
        xs = panel.xs
        if _log_x(xs):
            ax.set_xscale("log")
            ax.xaxis.set_minor_locator(NullLocator())
        if len(xs) <= 10:
            ax.set_xticks(xs, labels=[_num(x) for x in xs])
        if plot.log_y:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _num(v)))
        else:
            ax.set_ylim(0, 1.08 * top if top > 0 else 1.0)
        ax.set_xlabel(_MODE_AXIS[panel.mode])
        ax.set_ylabel(plot.y_label)
        ax.grid(True, alpha=0.3)
    if not plot.panels:
        axes[0].text(0.5, 0.5, "no measurements", ha="center", va="center", transform=axes[0].transAxes)
    styles = {name: Line2D([], [], color="0.3", ls=mpl) for name, mpl, _ in _PERCENTILES} if plot.styles else {}
    slo = {f"SLO p95 {_ms(plot.slo)} ms": Line2D([], [], color=_ERROR_COLOR, lw=1, ls=(0, (4, 3)))} if plot.slo else {}
    legend = {**runs, **styles, **slo, **marks}
    if legend:
        fig.legend(list(legend.values()), list(legend), loc="outside lower center", ncols=min(len(legend), 6))
    fig.savefig(path)


def _mpl_text(text: str) -> str:
    """Matplotlib reads `$...$` as mathematics; a label is plain text."""
    return text.replace("$", r"\$")


# ---------------------------------------------------------------- SVG


@dataclass(frozen=True)
class _Scale:
    lo: float
    hi: float
    log: bool
    start: float  # pixels
    end: float

    def __call__(self, v: float) -> float:
        if self.hi == self.lo:
            return (self.start + self.end) / 2
        f = (
            (math.log10(v) - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo))
            if self.log
            else (v - self.lo) / (self.hi - self.lo)
        )
        return self.start + f * (self.end - self.start)


def _linear_ticks(hi: float, count: int = 5) -> list[float]:
    hi = hi if hi > 0 else 1.0
    raw = hi / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [i * step for i in range(math.ceil(hi / step - 1e-9) + 1)]


def _log_ticks(lo: float, hi: float) -> list[float]:
    decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
    steps = (1, 2, 5) if len(decades) <= 3 else (1,)
    ticks = [m * 10.0**d for d in decades for m in steps]
    below = max((t for t in ticks if t <= lo), default=ticks[0])
    above = min((t for t in ticks if t >= hi), default=ticks[-1])
    return [t for t in ticks if below <= t <= above]


def _svg_text(x: float, y: float, text: str, anchor: str = "middle", cls: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" class="{cls}">{html.escape(text)}</text>'


_WIDTH, _PH = 1080, 300  # the whole plot (panels share the width), one panel's height
_M = {"left": 64, "right": 16, "top": 30, "bottom": 46}


def _svg_panel(plot: _Plot, panel: _Panel, left: float, top: float, width: float) -> list[str]:
    x0, x1 = left + _M["left"], left + width - _M["right"]
    y0, y1 = top + _PH - _M["bottom"], top + _M["top"]
    xs = panel.xs
    log_x = _log_x(xs)
    xscale = _Scale(min(xs), max(xs), log_x, x0 + 14, x1 - 14)
    values = panel.ys + ([plot.slo] if plot.slo is not None else [])
    if plot.log_y:
        positive = [v for v in values if v > 0] or [1.0]
        yticks = _log_ticks(min(positive), max(positive))
    else:
        yticks = _linear_ticks(1.06 * max(values, default=0.0))  # headroom keeps points off the frame
    yscale = _Scale(yticks[0], yticks[-1], plot.log_y, y0, y1)
    out = [
        f'<g class="panel" data-mode="{panel.mode}" data-xscale="{"log" if log_x else "linear"}">',
        f'<rect x="{x0}" y="{y1}" width="{x1 - x0}" height="{y0 - y1}" class="frame"/>',
    ]
    for t in yticks:
        y = yscale(t)
        out.append(f'<line x1="{x0}" x2="{x1}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        out.append(_svg_text(x0 - 6, y + 4, _num(t), "end", "tick"))
    xticks = xs if len(xs) <= 10 else _log_ticks(xs[0], xs[-1]) if log_x else _linear_ticks(xs[-1])
    for t in xticks:
        if xs[0] <= t <= xs[-1]:
            out.append(_svg_text(xscale(t), y0 + 16, _num(t), cls="tick"))
    out.append(_svg_text((x0 + x1) / 2, y0 + 36, _MODE_AXIS[panel.mode] + (" — log scale" if log_x else "")))
    mid = (y0 + y1) / 2
    out.append(
        f'<text x="{left + 16}" y="{mid:.1f}" text-anchor="middle" transform="rotate(-90 {left + 16} {mid:.1f})">'
    )
    out.append(f"{html.escape(plot.y_label)}</text>")
    if plot.slo is not None:
        y = yscale(plot.slo)
        out.append(f'<line x1="{x0}" x2="{x1}" y1="{y:.1f}" y2="{y:.1f}" class="slo"/>')
        out.append(_svg_text(x0 + 6, y - 5, f"SLO p95 {_ms(plot.slo)} ms", "start", "slo-label"))
    dashes = {name: dash for name, _, dash in _PERCENTILES}
    for s in panel.series:
        coords = [(xscale(p.x), yscale(p.y) if p.y > 0 or not plot.log_y else y0) for p in s.points]
        dash = f' stroke-dasharray="{dashes[s.style]}"' if plot.styles and dashes[s.style] else ""
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
        out.append(f'<polyline points="{path}" stroke="{s.color}"{dash} class="line"/>')
        for p, (x, y) in zip(s.points, coords, strict=True):
            if p.errors:
                out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="8" class="error-mark"/>')
            if p.generator_limited:
                d = f"M{x:.1f},{y - 9:.1f} L{x + 9:.1f},{y:.1f} L{x:.1f},{y + 9:.1f} L{x - 9:.1f},{y:.1f} Z"
                out.append(f'<path d="{d}" class="gl-mark"/>')
            flags = " ".join(f for f, on in (("errors", p.errors), ("generator-limited", p.generator_limited)) if on)
            out.append(
                f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{s.color}" data-flags="{flags}">'
                f"<title>{html.escape(p.title)}</title></circle>"
            )
    out.append("</g>")
    return out


def _svg_legend(plot: _Plot, width: float) -> tuple[list[str], float]:
    items: dict[str, str] = {}  # name → swatch svg (drawn at 0,0)
    for panel in plot.panels:
        for s in panel.series:
            items.setdefault(s.name, f'<line x1="0" x2="18" y1="0" y2="0" stroke="{s.color}" class="line"/>')
    points = [p for panel in plot.panels for s in panel.series for p in s.points]
    if plot.styles:
        for name, _, dash in _PERCENTILES:
            items[name] = f'<line x1="0" x2="18" y1="0" y2="0" stroke="#555" stroke-dasharray="{dash}" class="line"/>'
    if plot.slo is not None:
        items["SLO p95"] = '<line x1="0" x2="18" y1="0" y2="0" class="slo"/>'
    if any(p.generator_limited for p in points):
        items["generator-limited (load generator was the limit)"] = (
            '<path d="M9,-7 L16,0 L9,7 L2,0 Z" class="gl-mark"/>'
        )
    if any(p.errors for p in points):
        items["with errors"] = '<circle cx="9" cy="0" r="6" class="error-mark"/>'
    out, x, y = [], 12.0, 18.0
    for name, swatch in items.items():
        w = 30 + 6.6 * len(name)
        if x + w > width and x > 12:
            x, y = 12.0, y + 20
        out.append(f'<g transform="translate({x:.0f},{y:.0f})">{swatch}{_svg_text(24, 4, name, "start")}</g>')
        x += w + 14
    return out, y + 14


def _svg(plot: _Plot) -> str:
    width, panel_width = _WIDTH, _WIDTH / max(len(plot.panels), 1)
    legend, top = _svg_legend(plot, width)
    body = [
        line
        for i, panel in enumerate(plot.panels)
        for line in _svg_panel(plot, panel, i * panel_width, top, panel_width)
    ]
    if not plot.panels:
        body = [_svg_text(width / 2, top + _PH / 2, "no measurements")]
    height = top + _PH
    return "\n".join(
        [
            f'<svg class="plot" data-plot="{plot.key}" viewBox="0 0 {width} {height:.0f}" '
            f'width="{width}" height="{height:.0f}" xmlns="http://www.w3.org/2000/svg" role="img" '
            f'aria-label="{html.escape(plot.title)}">',
            *legend,
            *body,
            "</svg>",
        ]
    )


# ---------------------------------------------------------------- HTML

_CSS = """
:root{--fg:#1d2330;--muted:#5f6b7a;--line:#e3e7ee;--bg:#f6f7f9;--err:#b3261e;--errbg:#fdecea;--warn:#8a5a00;
--warnbg:#fff4d6;--ok:#1e7b34;--okbg:#e6f4ea}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);
font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1160px;margin:0 auto;padding:24px}
h1{font-size:26px;margin:0 0 4px}h2{font-size:19px;margin:0 0 12px}
section{background:#fff;border:1px solid var(--line);border-radius:10px;padding:18px 20px;margin:0 0 18px}
.meta{color:var(--muted);margin:0}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 16px;margin:12px 0 0}dt{color:var(--muted)}dd{margin:0}
.advice{border-left:5px solid #0072B2}.advice ul{margin:0;padding-left:20px}.advice li{margin:4px 0}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
th,td{padding:6px 10px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
th{font-size:13px;color:var(--muted);font-weight:600;background:#fafbfc}
td.n,th.n{text-align:right;white-space:nowrap}
.summary td:nth-child(2),.summary th{white-space:nowrap}tr.run-start td{border-top:2px solid #c5ccd6}
tr.err td{background:var(--errbg);color:var(--err)}
tr.failed td{background:var(--errbg);color:var(--err);font-weight:600}
tr.gen td:first-child{box-shadow:inset 4px 0 var(--warn)}
.badge{display:inline-block;padding:0 8px;border-radius:10px;font-size:12px;font-weight:600;white-space:nowrap}
.yes{background:var(--okbg);color:var(--ok)}.no{background:var(--errbg);color:var(--err)}
.unknown{background:#eceff3;color:var(--muted)}.warn{background:var(--warnbg);color:var(--warn)}
figure{margin:0 0 22px}figcaption{font-weight:600;margin-bottom:4px}
svg.plot{width:100%;height:auto;font-size:12px;fill:var(--fg)}
svg .frame{fill:#fff;stroke:#cfd5de}svg .grid{stroke:#edf0f4}svg .tick{fill:var(--muted)}
svg .line{fill:none;stroke-width:2}svg .slo{stroke:#D62728;stroke-width:1.3;stroke-dasharray:5 4}
svg .slo-label{fill:#D62728;paint-order:stroke;stroke:#fff;stroke-width:4px;stroke-linejoin:round}
svg .error-mark{fill:none;stroke:#D62728;stroke-width:2;pointer-events:none}
svg .gl-mark{fill:none;stroke:#222;stroke-width:1.5;pointer-events:none}
svg .point{stroke:#fff;stroke-width:1.5;cursor:crosshair}svg .point:hover{r:7;stroke:#222}
pre{white-space:pre-wrap;background:var(--errbg);color:var(--err);padding:10px;border-radius:6px;margin:6px 0 0}
.hint{color:var(--muted);font-size:13px;margin:0 0 10px}
"""


def _table(headers: Sequence[str], rows: Iterable[tuple[Sequence[str], str]], numeric: set[int], cls: str = "") -> str:
    """Rows are (already escaped HTML cells, the row's class)."""
    head = "".join(f'<th class="{"n" if i in numeric else ""}">{html.escape(h)}</th>' for i, h in enumerate(headers))
    body = "".join(
        f'<tr class="{row_cls}">'
        + "".join(f'<td class="{"n" if i in numeric else ""}">{c}</td>' for i, c in enumerate(cells))
        + "</tr>"
        for cells, row_cls in rows
    )
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _html_header(r: Results) -> str:
    m = r.machine
    slo = "none" if r.slo_p95_ms is None else f"p95 ≤ {_ms(r.slo_p95_ms)} ms"
    facts = {
        "Model": f"{r.model_name} ({r.model})",
        "Payload": r.payload,
        "Machine": f"{m.hostname} · {m.platform} · {m.cpu_model} · {m.cpu_count} CPUs · {m.memory_mib / 1024:,.1f} GiB",
        "Versions": " · ".join([f"twinserve {r.twinserve_version}", f"python {m.python}"])
        + "".join(f" · {k} {v}" for k, v in sorted(r.versions.items())),
        "Measured": f"{_num(r.duration_s)} s per level after {_num(r.warmup_s)} s warm-up",
        "Latency SLO": slo,
    }
    rows = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in facts.items())
    return (
        f"<section><h1>twinserve report: {html.escape(r.model_name)}</h1>"
        f'<p class="meta">{html.escape(r.created)}</p><dl>{rows}</dl></section>'
    )


def _html_summary(r: Results) -> str:
    rows = []
    previous = 0
    for row in _rows(r):
        cells = [html.escape(c) for c in row.cells]
        if row.generator_limited:
            cells[-1] = cells[-1].replace("generator-limited", '<span class="badge warn">generator-limited</span>', 1)
        classes = [
            name
            for name, on in (
                ("failed", row.failed),
                ("err", row.errors),
                ("gen", row.generator_limited),
                ("run-start", row.run != previous),
            )
            if on
        ]
        rows.append((cells, " ".join(classes)))
        previous = row.run
    hint = (
        f'<p class="hint">{_UNITS} Red rows had errors. Rows marked generator-limited measured the load '
        "generator, not the server: their throughput is a lower bound.</p>"
    )
    return f"<section><h2>Summary</h2>{hint}{_table(_COLUMNS, rows, _NUMERIC, 'summary')}</section>"


def _html_plots(plots: Sequence[_Plot]) -> str:
    figures = "".join(f"<figure><figcaption>{html.escape(p.title)}</figcaption>{_svg(p)}</figure>" for p in plots)
    hint = '<p class="hint">Hover a point for its numbers. PNG copies are in <code>plots/</code>.</p>'
    return f"<section><h2>Plots</h2>{hint}{figures}</section>"


def _html_ceiling(r: Results) -> str:
    if not r.ceiling:
        return ""
    rows = []
    for c in sorted(r.ceiling, key=lambda c: c.batch_size):
        per_instance = _ms(c.batch_ms_median / max(c.batch_size, 1))
        rows.append(([f"{c.batch_size:,}", _ms(c.batch_ms_median), per_instance, f"{c.instances_per_s:,.0f}"], ""))
    hint = '<p class="hint">The model alone, in-process, no server: what no architecture can beat.</p>'
    headers = ("Batch size", "ms / batch (median)", "ms / instance", "instances / s")
    return f"<section><h2>In-process ceiling</h2>{hint}{_table(headers, rows, {0, 1, 2, 3})}</section>"


def _html_verdicts(r: Results) -> str:
    if not r.verdicts:
        return ""
    badge = {
        True: '<span class="badge yes">yes</span>',
        False: '<span class="badge no">no</span>',
        None: '<span class="badge unknown">can&#x27;t tell</span>',
    }
    rows = [
        ([html.escape(v.claim), html.escape(v.source), badge[v.holds], html.escape(v.evidence)], "") for v in r.verdicts
    ]
    return f"<section><h2>Claims checked</h2>{_table(('Claim', 'Source', 'Holds', 'Evidence'), rows, set())}</section>"


def _html_failed(r: Results) -> str:
    failed = [run for run in r.runs if run.error]
    if not failed:
        return ""
    items = "".join(
        f"<li><b>{html.escape(run.label)}</b> ({html.escape(run.arch)}, <code>{html.escape(' '.join(run.command))}"
        f"</code>)<pre>{html.escape(run.error or '')}</pre></li>"
        for run in failed
    )
    return f'<section class="failed-runs"><h2>Runs that failed</h2><ul>{items}</ul></section>'


def _html_advice(advice: Sequence[str]) -> str:
    if not advice:
        return ""
    items = "".join(f"<li>{html.escape(line.removeprefix('- '))}</li>" for line in advice)  # the list marks them
    return f'<section class="advice"><h2>Advice</h2><ul>{items}</ul></section>'


def _html(results: Results, plots: Sequence[_Plot], advice: Sequence[str]) -> str:
    sections = [
        _html_header(results),
        _html_advice(advice),
        _html_failed(results),
        _html_summary(results),
        _html_plots(plots),
        _html_ceiling(results),
        _html_verdicts(results),
    ]
    body = "\n".join(s for s in sections if s)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>twinserve report: {html.escape(results.model_name)}</title><style>{_CSS}</style></head>"
        f"<body><main>\n{body}\n</main></body></html>\n"
    )


# ---------------------------------------------------------------- public API


def write_report(results: Results, out_dir: Path, advice: Sequence[str] = ()) -> list[Path]:
    """Write `out_dir/report.html` (self-contained, offline) and `out_dir/plots/<plot>.png`; return their paths."""
    plots = _plots(results)
    (out_dir / "plots").mkdir(parents=True, exist_ok=True)
    written = [out_dir / "report.html"]
    written[0].write_text(_html(results, plots, advice), encoding="utf-8")
    for plot in plots:
        path = out_dir / "plots" / f"{plot.key}.png"
        _write_png(plot, path)
        written.append(path)
    return written


def summary_table(results: Results) -> Table:
    """The per-run, per-level summary for the terminal: errors in red, generator-limited levels in yellow."""
    table = Table(
        title=f"{results.model_name}: {len(results.runs)} runs",
        caption=_UNITS,
        header_style="bold",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    rows = _rows(results)
    for i, name in enumerate(_COLUMNS):
        # Numbers never wrap; free text wraps so that the table fits an 80-column terminal.
        wraps = name in {"Run", "Errors", "Notes"}
        table.add_column(
            name,
            justify="right" if i in _NUMERIC else "left",
            no_wrap=not wraps,
            overflow="fold",
            min_width=6 if wraps else None,
        )
    for row, following in zip(rows, [*rows[1:], None], strict=True):
        style = "bold red" if row.failed else "red" if row.errors else "yellow" if row.generator_limited else None
        table.add_row(*row.cells, style=style, end_section=following is not None and following.run != row.run)
    return table


def print_summary(results: Results, console: Console | None = None) -> None:
    """Print `summary_table` to `console` (a new stdout console when None)."""
    (console or Console()).print(summary_table(results))
