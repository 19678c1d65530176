"""The report's inline SVG plots: a `Plot` drawn as hoverable SVG, scales, ticks and legend included."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

from twinserve.lab.report.plots import MODE_AXIS, PERCENTILE_STYLES, Panel, Plot, log_scaled
from twinserve.lab.report.rows import format_ms, format_number

__all__ = ["Scale", "linear_ticks", "plot_svg", "svg_text"]


@dataclass(frozen=True)
class Scale:
    """Maps a value in [lo, hi] to pixels in [start, end], linearly or on a log scale."""

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


def linear_ticks(hi: float, count: int = 5) -> list[float]:
    """Round ticks from 0 to at least `hi`, in at most `count` steps."""
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


def svg_text(x: float, y: float, text: str, anchor: str = "middle", cls: str = "") -> str:
    """An SVG `<text>` element, its text escaped."""
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" class="{cls}">{html.escape(text)}</text>'


_WIDTH, _PH = 1080, 300  # the whole plot (panels share the width), one panel's height
_M = {"left": 64, "right": 16, "top": 30, "bottom": 46}


def _svg_panel(plot: Plot, panel: Panel, left: float, top: float, width: float) -> list[str]:
    x0, x1 = left + _M["left"], left + width - _M["right"]
    y0, y1 = top + _PH - _M["bottom"], top + _M["top"]
    xs = panel.xs
    log_x = log_scaled(xs)
    xscale = Scale(min(xs), max(xs), log_x, x0 + 14, x1 - 14)
    values = panel.ys + ([plot.slo] if plot.slo is not None else [])
    if plot.log_y:
        positive = [v for v in values if v > 0] or [1.0]
        yticks = _log_ticks(min(positive), max(positive))
    else:
        yticks = linear_ticks(1.06 * max(values, default=0.0))  # headroom keeps points off the frame
    yscale = Scale(yticks[0], yticks[-1], plot.log_y, y0, y1)
    out = [
        f'<g class="panel" data-mode="{panel.mode}" data-xscale="{"log" if log_x else "linear"}">',
        f'<rect x="{x0}" y="{y1}" width="{x1 - x0}" height="{y0 - y1}" class="frame"/>',
    ]
    for t in yticks:
        y = yscale(t)
        out.append(f'<line x1="{x0}" x2="{x1}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        out.append(svg_text(x0 - 6, y + 4, plot.y_tick(t), "end", "tick"))
    xticks = xs if len(xs) <= 10 else _log_ticks(xs[0], xs[-1]) if log_x else linear_ticks(xs[-1])
    for t in xticks:
        if xs[0] <= t <= xs[-1]:
            out.append(svg_text(xscale(t), y0 + 16, format_number(t), cls="tick"))
    out.append(svg_text((x0 + x1) / 2, y0 + 36, MODE_AXIS[panel.mode] + (" — log scale" if log_x else "")))
    mid = (y0 + y1) / 2
    out.append(
        f'<text x="{left + 16}" y="{mid:.1f}" text-anchor="middle" transform="rotate(-90 {left + 16} {mid:.1f})">'
    )
    out.append(f"{html.escape(plot.y_label)}</text>")
    if plot.slo is not None:
        y = yscale(plot.slo)
        out.append(f'<line x1="{x0}" x2="{x1}" y1="{y:.1f}" y2="{y:.1f}" class="slo"/>')
        out.append(svg_text(x0 + 6, y - 5, f"SLO p95 {format_ms(plot.slo)} ms", "start", "slo-label"))
    dashes = {name: dash for name, _, dash in PERCENTILE_STYLES}
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


def _svg_legend(plot: Plot, width: float) -> tuple[list[str], float]:
    items: dict[str, str] = {}  # name → swatch svg (drawn at 0,0)
    for panel in plot.panels:
        for s in panel.series:
            items.setdefault(s.name, f'<line x1="0" x2="18" y1="0" y2="0" stroke="{s.color}" class="line"/>')
    points = [p for panel in plot.panels for s in panel.series for p in s.points]
    if plot.styles:
        for name, _, dash in PERCENTILE_STYLES:
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
        out.append(f'<g transform="translate({x:.0f},{y:.0f})">{swatch}{svg_text(24, 4, name, "start")}</g>')
        x += w + 14
    return out, y + 14


def plot_svg(plot: Plot) -> str:
    """`plot` as one inline, hoverable SVG element."""
    width, panel_width = _WIDTH, _WIDTH / max(len(plot.panels), 1)
    legend, top = _svg_legend(plot, width)
    body = [
        line
        for i, panel in enumerate(plot.panels)
        for line in _svg_panel(plot, panel, i * panel_width, top, panel_width)
    ]
    if not plot.panels:
        body = [svg_text(width / 2, top + _PH / 2, "no measurements")]
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
