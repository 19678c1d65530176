"""The report's one offline HTML page: its style sheet and sections (facts, advice, failed runs, summary, plots,
memory by role, ceiling, verdicts), every text escaped.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence

from twinserve.lab.report.plots import Plot
from twinserve.lab.report.rows import COLUMNS, NUMERIC_COLUMNS, UNITS, format_ms, format_number, summary_rows
from twinserve.lab.report.svg import plot_svg
from twinserve.lab.results import Results
from twinserve.lab.verdicts import ARTICLE, SOURCES

__all__ = ["STYLE_SHEET", "html_page", "html_table"]

#: The report's CSS, inlined in its page (the tune report shares it).
STYLE_SHEET = """
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


def html_table(
    headers: Sequence[str], rows: Iterable[tuple[Sequence[str], str]], numeric: set[int], cls: str = ""
) -> str:
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
    slo = "none" if r.slo_p95_ms is None else f"p95 ≤ {format_ms(r.slo_p95_ms)} ms"
    facts = {
        "Model": f"{r.model_name} ({r.model})",
        "Payload": r.payload,
        "Machine": f"{m.hostname} · {m.platform} · {m.cpu_model} · {m.cpu_count} CPUs · {m.memory_mib / 1024:,.1f} GiB",
        "Versions": " · ".join([f"twinserve {r.twinserve_version}", f"python {m.python}"])
        + "".join(f" · {k} {v}" for k, v in sorted(r.versions.items())),
        "Measured": f"{format_number(r.duration_s)} s per level after {format_number(r.warmup_s)} s warm-up",
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
    for row in summary_rows(r):
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
        f'<p class="hint">{UNITS} Red rows had errors. Rows marked generator-limited measured the load '
        "generator, not the server: their throughput is a lower bound.</p>"
    )
    return f"<section><h2>Summary</h2>{hint}{html_table(COLUMNS, rows, NUMERIC_COLUMNS, 'summary')}</section>"


def _html_plots(plots: Sequence[Plot]) -> str:
    figures = "".join(f"<figure><figcaption>{html.escape(p.title)}</figcaption>{plot_svg(p)}</figure>" for p in plots)
    hint = '<p class="hint">Hover a point for its numbers. PNG copies are in <code>plots/</code>.</p>'
    return f"<section><h2>Plots</h2>{hint}{figures}</section>"


def _html_ceiling(r: Results) -> str:
    if not r.ceiling:
        return ""
    rows = []
    for c in sorted(r.ceiling, key=lambda c: (-(c.threads or 0), c.batch_size)):
        per_instance = format_ms(c.batch_ms_median / max(c.batch_size, 1))
        threads = "default" if c.threads is None else f"{c.threads}"
        cells = [threads, f"{c.batch_size:,}", format_ms(c.batch_ms_median), per_instance, f"{c.instances_per_s:,.0f}"]
        rows.append(([*cells, f"{c.cores:.2f}"], ""))
    hint = (
        '<p class="hint">The model alone, in-process, no server: what no architecture can beat. Measured under '
        "each math-thread cap a server gives its processes (a model that computes on one core: once).</p>"
    )
    headers = ("Math threads", "Batch size", "ms / batch (median)", "ms / instance", "instances / s", "cores busy")
    return f"<section><h2>In-process ceiling</h2>{hint}{html_table(headers, rows, {1, 2, 3, 4, 5})}</section>"


def _html_verdicts(r: Results) -> str:
    if not r.verdicts:
        return ""
    badge = {
        True: '<span class="badge yes">yes</span>',
        False: '<span class="badge no">no</span>',
        None: '<span class="badge unknown">can&#x27;t tell</span>',
    }
    rows = [
        (
            [
                html.escape(v.claim),
                html.escape(v.source)
                + (f'<p class="meta">{html.escape(SOURCES[v.source])}</p>' if v.source in SOURCES else ""),
                html.escape(v.claimed or "—"),
                html.escape(v.measured or "—"),
                badge[v.holds],
                html.escape(v.evidence),
            ],
            "",
        )
        for v in r.verdicts
    ]
    hint = (
        f'<p class="hint">The claims of the article &ldquo;{html.escape(ARTICLE)}&rdquo;, the one twinserve grew '
        "from (its points are numbered S1..S27), each judged on these runs, with the article's words.</p>"
    )
    headers = ("Claim", "Source", "Claimed", "Measured", "Holds", "Evidence")
    return f"<section><h2>Claims checked</h2>{hint}{html_table(headers, rows, set())}</section>"


def _html_memory(r: Results) -> str:
    """Each run at its memory peak: the tree's PSS beside its summed RSS, and the processes by role."""
    rows = []
    for run in r.runs:
        measured = [lv for lv in run.levels if lv.resources is not None]
        if not measured:
            continue
        level = max(measured, key=lambda lv: lv.resources.memory_mib if lv.resources else 0.0)
        res = level.resources
        assert res is not None
        pss = "—" if res.pss_mib_max is None else f"{res.pss_mib_max:,.0f}"
        cells = [html.escape(run.label), html.escape(level.load_text), pss, f"{res.rss_mib_max:,.0f}"]
        rows.append(([*cells, html.escape(res.roles_text() or "—")], ""))
    if not rows:
        return ""
    hint = (
        '<p class="hint">At each run\'s peak. PSS charges a page its processes share (forked workers share their '
        "parent's) to each in equal parts, so the tree's PSS is what the kernel holds for the server; summed RSS "
        "counts a shared page once per process. A supervisor (gunicorn's arbiter, uvicorn's process manager) "
        "holds no model; servers answer HTTP and hold the model, unless model workers do (hybrid).</p>"
    )
    headers = ("Run", "Peak at", "PSS MiB", "RSS summed MiB", "By role (PSS)")
    return f"<section><h2>Memory by role</h2>{hint}{html_table(headers, rows, {2, 3})}</section>"


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


def html_page(results: Results, plots: Sequence[Plot], advice: Sequence[str]) -> str:
    """The whole report as one self-contained HTML document."""
    sections = [
        _html_header(results),
        _html_advice(advice),
        _html_failed(results),
        _html_summary(results),
        _html_plots(plots),
        _html_memory(results),
        _html_ceiling(results),
        _html_verdicts(results),
    ]
    body = "\n".join(s for s in sections if s)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>twinserve report: {html.escape(results.model_name)}</title><style>{STYLE_SHEET}</style></head>"
        f"<body><main>\n{body}\n</main></body></html>\n"
    )
