"""The report's terminal summary: the rows as a rich `Table`, errors in red, generator-limited levels in yellow."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from twinserve.lab.report.rows import COLUMNS, NUMERIC_COLUMNS, UNITS, summary_rows
from twinserve.lab.results import Results

__all__ = ["print_summary", "summary_table"]


def summary_table(results: Results) -> Table:
    """The per-run, per-level summary for the terminal: errors in red, generator-limited levels in yellow."""
    table = Table(
        title=f"{results.model_name}: {len(results.runs)} runs",
        caption=UNITS,
        header_style="bold",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    rows = summary_rows(results)
    for i, name in enumerate(COLUMNS):
        # Numbers never wrap; free text wraps so that the table fits an 80-column terminal.
        wraps = name in {"Run", "Errors", "Notes"}
        table.add_column(
            name,
            justify="right" if i in NUMERIC_COLUMNS else "left",
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
