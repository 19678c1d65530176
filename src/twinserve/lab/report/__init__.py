"""Turn a `Results` into a report: one offline HTML file with hoverable SVG plots, PNG plots, and a terminal table.

The figures are first reduced to plain data (`Plot` → `Panel` → `Series` → `Point`, and `SummaryRow` for tables);
the SVG, PNG, HTML and rich renderers only draw that data, so every output shows the same numbers.

The package owns `write_report`, which writes the files; the parts are its modules: `rows` (number formatting and
the summary table's rows), `plots` (the plot data), `png` (matplotlib), `svg`, `html` and `terminal` (rich:
`summary_table`, `print_summary`, re-exported here).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from twinserve.lab.report.html import html_page
from twinserve.lab.report.plots import build_plots
from twinserve.lab.report.png import write_png
from twinserve.lab.report.terminal import print_summary, summary_table
from twinserve.lab.results import Results

__all__ = ["print_summary", "summary_table", "write_report"]


def write_report(results: Results, out_dir: Path, advice: Sequence[str] = ()) -> list[Path]:
    """Write `out_dir/report.html` (self-contained, offline) and `out_dir/plots/<plot>.png`; return their paths."""
    plots = build_plots(results)
    (out_dir / "plots").mkdir(parents=True, exist_ok=True)
    written = [out_dir / "report.html"]
    written[0].write_text(html_page(results, plots, advice), encoding="utf-8")
    for plot in plots:
        path = out_dir / "plots" / f"{plot.key}.png"
        write_png(plot, path)
        written.append(path)
    return written
