"""The report on real files: PNGs read back, the HTML parsed, the terminal table rendered, and Chromium drawing it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread
from rich.console import Console

from tests.factory import level, results, run
from tests.live.lab.browser import chromium
from twinserve.lab.report import print_summary, summary_table, write_report
from twinserve.lab.results import Ceiling, Level, Results, Verdict
from twinserve.lab.verdicts import ARTICLE, SOURCES

EVIL = '<script>alert("x")</script>'
SYNC = f"sync {EVIL}"
FAILURE = "server did not answer /health within 30 s\nTraceback (most recent call last): <b>boom</b>"
ADVICE = ("Pick async: 3.2x the req/s of sync at 32 connections.", "<img src=x onerror=alert(1)> stays text")
PLOTS = ("throughput", "latency", "memory", "cpu", "errors")
# Every tag the report may contain: no script, img, link, iframe, ...
TAGS = frozenset(
    {"html", "head", "meta", "title", "style", "body", "main", "section", "h1", "h2", "p", "dl", "dt", "dd", "ul"}
    | {"li", "b", "code", "pre", "table", "thead", "tbody", "tr", "th", "td", "span", "figure", "figcaption"}
    | {"svg", "g", "rect", "line", "text", "polyline", "circle", "path"}
)
ORANGE = np.array([0xE6, 0x9F, 0x00]) / 255  # the second run's colour


def open_loop(rate: float, p95: float, *, errors: int = 0) -> Level:
    return level(0, rate * 0.98, p95, errors=errors).model_copy(
        update={"mode": "open", "concurrency": None, "rate": rate}
    )


def full_results() -> Results:
    """Two runs measured (closed and open loop, errors, a generator-limited level) and one that failed."""
    limited = level(64, 3100, 60).model_copy(update={"generator_limited": True})
    sync = run(SYNC, "sync", [level(1, 500, 5), level(8, 900, 20), level(32, 950, 80, errors=12)], workers=4)
    async_ = run(
        "async",
        "async",
        [
            *(level(1, 600, 4), level(8, 2500, 8), level(32, 3000, 30), limited),
            *(open_loop(100, 5), open_loop(1000, 12), open_loop(4000, 250, errors=40)),
        ],
    )
    failed = run("hybrid", "hybrid", []).model_copy(update={"error": FAILURE})
    return results(sync, async_, failed, slo=50.0).model_copy(
        update={
            "ceiling": [
                Ceiling(batch_size=1, batch_ms_median=0.25, instances_per_s=4000),
                Ceiling(batch_size=32, batch_ms_median=1.8, instances_per_s=17778),
            ],
            "verdicts": [
                Verdict(
                    claim="Async beats sync at high concurrency",
                    source="S20",
                    holds=True,
                    evidence="3,000 > 950",
                    claimed="5-10% lower",
                    measured="44% lower",
                ),
                Verdict(claim="Sync copes at low load", source="S3", holds=False, evidence="<b>503s</b> at 32"),
                Verdict(claim="Hybrid saves memory", source="S7", holds=None, evidence="hybrid failed"),
            ],
        }
    )


LEVELS = 10  # measured levels in full_results()


# ---------------------------------------------------------------- a small DOM over html.parser


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list[Node | str] = field(default_factory=list)

    def iter(self, tag: str | None = None) -> Iterator[Node]:
        for child in self.children:
            if isinstance(child, Node):
                if tag is None or child.tag == tag:
                    yield child
                yield from child.iter(tag)

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())


class TreeBuilder(HTMLParser):
    VOID = frozenset({"meta", "br", "img", "link", "input", "hr", "area", "base", "col", "source", "wbr"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in self.VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Node(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        tags = [n.tag for n in self.stack]
        if tag in tags[1:]:
            del self.stack[len(tags) - 1 - tags[::-1].index(tag) :]

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)


def parse(text: str) -> Node:
    builder = TreeBuilder()
    builder.feed(text)
    builder.close()
    return builder.root


def plots_in(doc: Node) -> dict[str, Node]:
    svgs = [n for n in doc.iter("svg") if "plot" in n.classes()]
    found = {n.attrs["data-plot"]: n for n in svgs}
    assert len(found) == len(svgs), "one svg per plot"
    return found


def point_titles(svg: Node) -> list[str]:
    points = [n for n in svg.iter() if "point" in n.classes()]
    titles = []
    for point in points:
        (title,) = list(point.iter("title"))
        titles.append(title.text())
    return titles


def summary_rows(doc: Node) -> list[tuple[set[str], str]]:
    (table,) = [t for t in doc.iter("table") if "summary" in t.classes()]
    rows = [(tr.classes(), [td.text() for td in tr.iter("td")]) for tr in table.iter("tr")]
    return [(classes, " | ".join(cells)) for classes, cells in rows if cells]


def assert_png_drawn(path: Path) -> np.ndarray:
    pixels = np.asarray(imread(path))
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100 and pixels.shape[2] in (3, 4)
    assert float(pixels[..., :3].var()) > 0, f"{path} is blank"
    return pixels


# ---------------------------------------------------------------- files and HTML


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    out = tmp_path_factory.mktemp("report")
    return out, write_report(full_results(), out, advice=ADVICE)


@pytest.fixture(scope="module")
def doc(report: tuple[Path, list[Path]]) -> Node:
    return parse((report[0] / "report.html").read_text(encoding="utf-8"))


def test_writes_the_html_and_one_png_per_plot(report: tuple[Path, list[Path]]) -> None:
    out, paths = report
    assert paths == [out / "report.html", *(out / "plots" / f"{name}.png" for name in PLOTS)]
    for png in paths[1:]:
        assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
        assert_png_drawn(png)


def test_each_plot_is_an_inline_svg_with_a_titled_point_per_value(doc: Node) -> None:
    plots = plots_in(doc)
    assert tuple(plots) == PLOTS
    titles = {name: point_titles(svg) for name, svg in plots.items()}
    expected = {"throughput": LEVELS, "latency": 3 * LEVELS, "memory": LEVELS, "cpu": LEVELS, "errors": LEVELS}
    assert {name: len(t) for name, t in titles.items()} == expected
    assert "async · 32 conns · 3,000 req/s · p95 30.0 ms" in titles["throughput"]
    assert "async · offered 4,000 req/s · 3,920 req/s · p99 375.0 ms · errors 40 (0.2%) · 503: 40" in titles["latency"]
    assert "async · 64 conns · 3,100 req/s · p95 60.0 ms · generator-limited" in titles["throughput"]
    assert f"{SYNC} · 1 conn · 500 req/s · RSS max 300 MiB · 2 processes" in titles["memory"]
    assert "async · 8 conns · 2,500 req/s · CPU 150% of one core (max 150%)" in titles["cpu"]
    assert f"{SYNC} · 8 conns · 900 req/s · error rate 0.00% (0 of 4,500)" in titles["errors"]


def test_closed_and_open_loop_get_separate_panels_with_log_x_when_wide(doc: Node) -> None:
    for svg in plots_in(doc).values():
        panels = {g.attrs["data-mode"]: g.attrs["data-xscale"] for g in svg.iter("g") if "panel" in g.classes()}
        assert panels == {"closed": "log", "open": "log"}  # 1 → 64 connections, 100 → 4,000 req/s


def test_marks_errors_generator_limits_and_the_slo(doc: Node) -> None:
    throughput = plots_in(doc)["throughput"]
    flags = [p.attrs["data-flags"] for p in throughput.iter("circle") if "point" in p.classes()]
    assert sorted(f for f in flags if f) == ["errors", "errors", "generator-limited"]
    assert len([n for n in throughput.iter() if "error-mark" in n.classes()]) == 2 + 1  # + its legend swatch
    latency = plots_in(doc)["latency"]
    assert [t.text() for t in latency.iter("text") if "slo-label" in t.classes()] == ["SLO p95 50.0 ms"] * 2


def test_summary_table_flags_errors_generator_limits_and_failures(doc: Node) -> None:
    rows = summary_rows(doc)
    assert len(rows) == LEVELS + 1
    errors = [text for classes, text in rows if "err" in classes]
    assert [t.split(" | ")[1] for t in errors] == ["32 conns", "4,000 req/s"]
    assert "12 (0.3%) · 503: 12" in errors[0]
    (limited,) = [text for classes, text in rows if "gen" in classes]
    assert limited.startswith("async | 64 conns | 3,100 |") and "generator-limited" in limited
    (failed,) = [text for classes, text in rows if "failed" in classes]
    assert failed.startswith("hybrid |") and failed.endswith("failed: server did not answer /health within 30 s")


def test_sections_in_order_with_header_ceiling_verdicts_and_failures(doc: Node) -> None:
    headings = [h.text() for h in doc.iter("h2")]
    assert headings == [
        "Advice",
        "Runs that failed",
        "Summary",
        "Plots",
        "Memory by role",
        "In-process ceiling",
        "Claims checked",
    ]
    header = next(doc.iter("section")).text()
    for fact in ("iris (twinserve.examples.tabular:Classifier)", "2 CPUs", "5 s per level after 1 s warm-up"):
        assert fact in header
    assert "p95 ≤ 50.0 ms" in header and "2026-11-29T12:00:00Z" in header
    advice = [li.text() for li in next(s for s in doc.iter("section") if "advice" in s.classes()).iter("li")]
    assert advice == list(ADVICE)
    failed = next(s for s in doc.iter("section") if "failed-runs" in s.classes())
    assert [p.text() for p in failed.iter("pre")] == [FAILURE]
    tables = list(doc.iter("table"))
    memory = [[td.text() for td in tr.iter("td")] for tr in tables[1].iter("tr")][1:]
    # Each measured run at its peak (these results have RSS only: no PSS column figure, no roles).
    assert memory == [[SYNC, "1 connection", "—", "300", "—"], ["async", "1 connection", "—", "300", "—"]]
    ceiling = [[td.text() for td in tr.iter("td")] for tr in tables[2].iter("tr")][1:]
    assert ceiling == [
        ["default", "1", "0.25", "0.25", "4,000", "1.00"],
        ["default", "32", "1.8", "0.06", "17,778", "1.00"],
    ]
    verdicts = [[td.text() for td in tr.iter("td")] for tr in tables[3].iter("tr")][1:]
    assert [v[1:] for v in verdicts] == [
        ["S20" + SOURCES["S20"], "5-10% lower", "44% lower", "yes", "3,000 > 950"],
        ["S3", "—", "—", "no", "<b>503s</b> at 32"],
        ["S7", "—", "—", "can't tell", "hybrid failed"],
    ]
    claims = next(s for s in doc.iter("section") if any(h.text() == "Claims checked" for h in s.iter("h2")))
    assert f"“{ARTICLE}”" in claims.text()


def test_all_text_is_escaped(report: tuple[Path, list[Path]], doc: Node) -> None:
    text = (report[0] / "report.html").read_text(encoding="utf-8")
    assert EVIL not in text and "<img" not in text and "<b>boom" not in text and "<b>503s" not in text
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in text
    assert {n.tag for n in doc.iter()} <= TAGS
    legend = [t.text() for t in plots_in(doc)["throughput"].iter("text")]
    assert SYNC in legend


def test_the_html_needs_nothing_from_the_network(report: tuple[Path, list[Path]], doc: Node) -> None:
    text = (report[0] / "report.html").read_text(encoding="utf-8")
    assert "@import" not in text and "url(" not in text
    assert not list(doc.iter("link")) and not list(doc.iter("script"))
    assert all("src" not in n.attrs and "href" not in n.attrs for n in doc.iter())


def test_narrow_closed_loop_only_results(tmp_path: Path) -> None:
    paths = write_report(results(run("async", "async", [level(1, 600, 4), level(8, 2500, 8)])), tmp_path)
    doc = parse(paths[0].read_text(encoding="utf-8"))
    for name, svg in plots_in(doc).items():
        panels = [g.attrs for g in svg.iter("g") if "panel" in g.classes()]
        assert panels == [{"class": "panel", "data-mode": "closed", "data-xscale": "linear"}], name
        assert len(point_titles(svg)) == (6 if name == "latency" else 2)
    assert not [s for s in doc.iter("section") if s.classes() & {"advice", "failed-runs"}]
    assert [h.text() for h in doc.iter("h2")] == ["Summary", "Plots", "Memory by role"]


def test_nothing_measured_still_writes_a_report(tmp_path: Path) -> None:
    only_failure = results(run("sync", "sync", []).model_copy(update={"error": "gunicorn exited with 3"}))
    paths = write_report(only_failure, tmp_path / "new" / "dir")
    doc = parse(paths[0].read_text(encoding="utf-8"))
    assert all(point_titles(svg) == [] for svg in plots_in(doc).values())
    assert "gunicorn exited with 3" in doc.text()
    for png in paths[1:]:
        assert_png_drawn(png)


# ---------------------------------------------------------------- terminal


def test_terminal_summary_table() -> None:
    console = Console(record=True, width=200)
    console.print(summary_table(full_results()))
    lines = console.export_text().splitlines()
    header = next(line for line in lines if "req/s" in line and "Errors" in line)
    assert header.split() == ["Run", "Load", "req/s", "p50", "p95", "p99", "Errors", "Mem", "MiB", "CPU", "%", "Notes"]
    row = next(line for line in lines if "32 conns" in line and "950" in line)
    cells = ["32", "conns", "950", "40.0", "80.0", "120.0", "12", "(0.3%)", "·", "503:", "12", "300", "150"]
    assert row.split() == ["sync", EVIL, *cells, "p95", "over", "SLO"]
    assert any("64 conns" in line and "generator-limited" in line for line in lines)
    assert any(line.lstrip().startswith("hybrid") and "failed: server did not answer" in line for line in lines)
    assert not any("Traceback" in line for line in lines)  # only the error's first line fits a table


def test_terminal_table_colours_errors_red_and_generator_limits_yellow() -> None:
    console = Console(record=True, width=200, force_terminal=True, color_system="standard")
    console.print(summary_table(full_results()))
    lines = console.export_text(styles=True).splitlines()
    red, yellow = re.compile(r"\x1b\[(\d+;)*31m"), re.compile(r"\x1b\[(\d+;)*33m")
    assert red.search(next(line for line in lines if "503: 12" in line))
    assert red.search(next(line for line in lines if "failed: server" in line))
    assert yellow.search(next(line for line in lines if "generator-limited" in line))
    assert "\x1b" not in next(line for line in lines if "2,500" in line)


def test_print_summary_prints_to_the_given_console() -> None:
    console = Console(record=True, width=200)
    print_summary(full_results(), console)
    assert "iris: 3 runs" in console.export_text()


# ---------------------------------------------------------------- a real browser


def test_chromium_renders_the_report(report: tuple[Path, list[Path]], tmp_path: Path) -> None:
    page = (report[0] / "report.html").resolve().as_uri()
    shot = tmp_path / "screenshot.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,4000", page)
    pixels = assert_png_drawn(shot)
    assert pixels.shape[:2] == (4000, 1280)
    orange = np.abs(pixels[..., :3] - ORANGE).max(axis=-1) < 0.05
    assert orange.sum() > 1000, "the plots' lines did not render"

    dom = parse(chromium(tmp_path, "--dump-dom", page))
    plots = plots_in(dom)
    assert tuple(plots) == PLOTS
    assert [len(point_titles(svg)) for svg in plots.values()] == [LEVELS, 3 * LEVELS, LEVELS, LEVELS, LEVELS]
    assert "async · 32 conns · 3,000 req/s · p95 30.0 ms" in point_titles(plots["throughput"])
    assert not list(dom.iter("script"))


def _y_ticks(svg: Node) -> list[list[str]]:
    """Each panel's y-axis tick labels (the right-aligned tick texts), top panel first."""
    panels = [g for g in svg.iter("g") if "panel" in g.classes()]
    return [
        [t.text() for t in g.iter("text") if "tick" in t.classes() and t.attrs.get("text-anchor") == "end"]
        for g in panels
    ]


def test_the_error_rate_axis_is_in_percent_as_its_label_says(doc: Node) -> None:
    """Before: "% of requests" over ticks 0-1, which read as a fraction; the values were percent already."""
    closed, opened = _y_ticks(plots_in(doc)["errors"])
    assert closed == ["0%", "0.1%", "0.2%", "0.3%"]  # sync's worst level: 12 errors of 4,750, 0.25%
    assert opened[-1] == "0.25%"  # async's: 40 of 19,600, 0.2%
    assert all(t.endswith("%") for t in opened)
    for name in ("throughput", "latency", "memory", "cpu"):
        assert not any(t.endswith("%") for ticks in _y_ticks(plots_in(doc)[name]) for t in ticks)


def test_without_errors_the_error_axis_still_says_percent() -> None:
    from twinserve.lab.report.plots import build_plots
    from twinserve.lab.report.svg import plot_svg

    clean = results(run("async", "async", [level(1, 400, 5), level(4, 1200, 8)]))
    (errors,) = [p for p in build_plots(clean) if p.key == "errors"]
    (ticks,) = _y_ticks(parse(plot_svg(errors)))
    assert ticks[0] == "0%" and ticks[-1] == "1%"  # 0-1 percent, not a 0-1 fraction
    assert errors.y_tick(0.5) == "0.5%"
