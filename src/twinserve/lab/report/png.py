"""The report's PNG plots: a `Plot` drawn with matplotlib, on a figure of its own (no pyplot global state)."""

from __future__ import annotations

from pathlib import Path

from twinserve.lab.report.plots import MODE_AXIS, PERCENTILE_STYLES, Plot, log_scaled
from twinserve.lab.report.rows import format_ms, format_number

__all__ = ["write_png"]

_ERROR_COLOR = "#D62728"


def write_png(plot: Plot, path: Path) -> None:
    """Draw `plot` with matplotlib into the PNG file at `path`."""
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
    dash = {name: mpl for name, mpl, _ in PERCENTILE_STYLES}
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
        if log_scaled(xs):
            ax.set_xscale("log")
            ax.xaxis.set_minor_locator(NullLocator())
        if len(xs) <= 10:
            ax.set_xticks(xs, labels=[format_number(x) for x in xs])
        if plot.log_y:
            ax.set_yscale("log")
        else:
            ax.set_ylim(0, 1.08 * top if top > 0 else 1.0)
        if plot.log_y or plot.y_suffix:
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _, plot=plot: plot.y_tick(v)))
        ax.set_xlabel(MODE_AXIS[panel.mode])
        ax.set_ylabel(plot.y_label)
        ax.grid(True, alpha=0.3)
    if not plot.panels:
        axes[0].text(0.5, 0.5, "no measurements", ha="center", va="center", transform=axes[0].transAxes)
    styles = {name: Line2D([], [], color="0.3", ls=mpl) for name, mpl, _ in PERCENTILE_STYLES} if plot.styles else {}
    slo = (
        {f"SLO p95 {format_ms(plot.slo)} ms": Line2D([], [], color=_ERROR_COLOR, lw=1, ls=(0, (4, 3)))}
        if plot.slo
        else {}
    )
    legend = {**runs, **styles, **slo, **marks}
    if legend:
        fig.legend(list(legend.values()), list(legend), loc="outside lower center", ncols=min(len(legend), 6))
    fig.savefig(path)


def _mpl_text(text: str) -> str:
    """Matplotlib reads `$...$` as mathematics; a label is plain text."""
    return text.replace("$", r"\$")
