"""Turn a `Results` into a report: one offline HTML file with hoverable SVG plots, PNG plots, and a terminal table.

The figures are first reduced to plain data (`_Plot` → `_Panel` → `_Series` → `_Point`, and `_Row` for tables);
the SVG, PNG, HTML and rich renderers only draw that data, so every output shows the same numbers.

This module owns `write_report`, which writes the files; the parts live beside it: `report_rows` (number formatting
and the summary table's rows), `report_plots` (the plot data), `report_png` (matplotlib), `report_svg`,
`report_html` and `report_terminal` (rich: `summary_table`, `print_summary`, re-exported here).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from twinserve.lab.report_html import _html
from twinserve.lab.report_plots import _plots
from twinserve.lab.report_png import _write_png
from twinserve.lab.report_terminal import print_summary, summary_table
from twinserve.lab.results import Results

__all__ = ["print_summary", "summary_table", "write_report"]


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
