"""What `twinserve tune` leaves in --out: `results.json` (every probe, the winner's capacity and its basis, every
candidate's standing), `winner.toml` (a settings file `twinserve serve --config` reads; for a model with
per-model settings of its own, the server-wide part, and `winner-model-settings.toml` its `[settings]` table),
`report.html` (the decision, a Pareto plot of throughput vs P95 with memory as marker size, every candidate and
every probe), and the lines printed at the end. What the lines say is `summary`'s.

The HTML reuses the bench report's style sheet, table and SVG scales (`lab.report.html`, `lab.report.svg`).
"""

from __future__ import annotations

import datetime
import html
import importlib.util
import math
from pathlib import Path
from typing import Any

import orjson

from twinserve import __version__
from twinserve.config import Config, load_config
from twinserve.lab.report.html import STYLE_SHEET, html_table
from twinserve.lab.report.svg import Scale, linear_ticks, svg_text
from twinserve.lab.settings_writer import serve_command, settings_file_text
from twinserve.lab.tune.runner import TuneOutcome
from twinserve.lab.tune.search import Ranked, meets
from twinserve.lab.tune.subject import candidate_settings, server_level, settings_table
from twinserve.lab.tune.summary import Summary, summarize

__all__ = [
    "decision_lines",
    "tune_record",
    "tune_summary",
    "winner_config",
    "winner_model_settings",
    "write_tune_outputs",
]

_ARCH_COLOURS = {"sync": "#0072B2", "async": "#E69F00", "hybrid": "#009E73"}
#: The Pareto plot's P95 axis stops at this many SLOs; points above sit on its edge.
_Y_CAP_SLOS = 3.0


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _ranked(r: Ranked | None) -> dict[str, Any] | None:
    if r is None:
        return None
    return {
        "label": r.candidate.label,
        "arch": r.candidate.arch,
        "settings": r.candidate.settings,
        "stage": r.stage,
        "score": _finite(r.score),
        "rate_rps": r.rate,
        "p95_ms": r.p95_ms,
    }


def portable_model(target: str) -> str:
    """MODEL as it resolves from any folder: a model file's path made absolute, and a module that is importable
    only from the folder tune ran in (not from an installed package) named by its file."""
    module, sep, attr = target.rpartition(":")
    if not sep or not module:
        return target
    if module.endswith(".py"):
        return f"{Path(module).resolve()}:{attr}"
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return target
    origin = None if found is None or found.origin is None else Path(found.origin).resolve()
    here = Path.cwd().resolve()
    if origin is None or not origin.is_relative_to(here) or "site-packages" in origin.parts or "." in module:
        return target
    return f"{origin}:{attr}"


def winner_config(outcome: TuneOutcome) -> Config | None:
    """The winner as `serve`'s Config: every setting, or for a model with settings of its own the server-wide
    ones alone (its knobs go in its own [settings]: `winner_model_settings`). The model is named so that
    `serve --config` finds it from any folder (`portable_model`, an absolute repository path)."""
    winner = outcome.decision.winner
    if winner is None:
        return None
    subject = outcome.request.subject
    if subject is None or not subject.per_model:
        model = portable_model(outcome.request.model)
        return load_config(models=[model], arch=winner.candidate.arch, **winner.candidate.settings)
    where: dict[str, Any] = (
        {"model_repository": str(Path(subject.repository).resolve())}
        if subject.repository is not None
        else {"models": [portable_model(subject.model)]}
    )
    return load_config(arch=winner.candidate.arch, **where, **server_level(winner.candidate))


def winner_model_settings(outcome: TuneOutcome) -> dict[str, Any] | None:
    """The winner's [settings] table for a model with settings of its own: its own, the winner's knobs over them
    (None: no winner, or a model the flags reach)."""
    winner, subject = outcome.decision.winner, outcome.request.subject
    if winner is None or subject is None or not subject.per_model:
        return None
    return candidate_settings(subject, winner.candidate)


def _subject_text(outcome: TuneOutcome) -> str:
    subject = outcome.request.subject
    if subject is not None and subject.repository is not None:
        return f"--model-repository {subject.repository} --model {subject.name}"
    return outcome.request.model


def _model_settings_text(outcome: TuneOutcome, settings: dict[str, Any]) -> str:
    subject = outcome.request.subject
    assert subject is not None and outcome.decision.winner is not None
    own = subject.settings or {}
    changed = [f"{k}: {own.get(k, '(unset)')} -> {v}" for k, v in settings.items() if own.get(k) != v] or ["none"]
    where = (
        f"the [settings] table of {subject.repository / subject.name / 'twinserve.toml'} (replace the table)"
        if subject.repository is not None
        else f"the `settings` class attribute of {subject.model} (as a dict), or a repository's twinserve.toml"
    )
    header = [
        f"twinserve tune {subject.name} ({datetime.date.today().isoformat()}): the model-level settings of "
        f"{outcome.decision.winner.candidate.label}",
        f"Put this in {where};",
        "the server-wide settings are in winner.toml. Changed from the model's own: " + "; ".join(changed),
    ]
    return "\n".join(f"# {line}" for line in header) + "\n" + settings_table(settings)


def tune_summary(outcome: TuneOutcome) -> Summary:
    """What the run's evidence supports: the capacity, every candidate's standing, the verdict's lines."""
    return summarize(
        outcome.plan,
        outcome.results,
        outcome.decision,
        pruned=len(outcome.space.pruned),
        elapsed_s=outcome.elapsed_s,
        budget_s=outcome.request.budget_s,
    )


def decision_lines(outcome: TuneOutcome) -> list[str]:
    """The verdict, as plain lines (the terminal, the report's first section, winner.toml's header)."""
    return tune_summary(outcome).lines


def _relative(path: str | None, out: Path | None) -> str | None:
    """A log's path relative to the results' folder where it lies in it (results.json names it from there)."""
    if path is None or out is None:
        return path
    try:
        return Path(path).resolve().relative_to(out.resolve()).as_posix()
    except ValueError:
        return path


def tune_record(outcome: TuneOutcome, machine: dict[str, Any], out: Path | None = None) -> dict[str, Any]:
    """Everything for results.json (`out`: its folder, which the server logs' paths are relative to)."""
    goal, d = outcome.request.goal, outcome.decision
    summary = tune_summary(outcome)
    probes = []
    for number, r in enumerate(outcome.results, 1):
        ok, why = meets(r, goal)
        probes.append(
            {
                "n": number,
                "label": r.probe.candidate.label,
                "arch": r.probe.candidate.arch,
                "settings": r.probe.candidate.settings,
                "stage": r.probe.stage,
                "rate_rps": r.probe.rate,
                "seconds": r.probe.seconds,
                "sent": r.sent,
                "errors": r.errors,
                "errors_by_kind": r.error_kinds,
                "achieved_rps": r.achieved_rps,
                "throughput_rps": r.throughput_rps,
                "latency_ms": {"p50": r.p50_ms, "p95": r.p95_ms, "p99": r.p99_ms, "mean": r.mean_ms},
                "memory_mib": r.memory_mib,
                "resources": None if r.resources is None else r.resources.model_dump(),
                "wall_s": r.wall_s,
                "failed": r.failed,
                "generator_limited": r.generator_limited,
                "log": _relative(r.log, out),
                "meets": ok,
                "why": why,
            }
        )
    config = winner_config(outcome)
    subject = outcome.request.subject
    per_model = subject is not None and subject.per_model
    return {
        "kind": "twinserve-tune",
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "twinserve_version": __version__,
        "machine": machine,
        "model": outcome.request.model,
        "model_name": outcome.model_name,
        "goal": {
            "slo_p95_ms": goal.slo_p95_ms,
            "slo_p99_ms": goal.slo_p99_ms,
            "target_rps": goal.target_rps,
            "max_memory_mib": goal.max_memory_mib,
        },
        "budget_s": outcome.request.budget_s,
        "elapsed_s": outcome.elapsed_s,
        "ceiling": [c.model_dump() for c in outcome.facts.ceiling],
        "notes": outcome.space.notes,
        "pruned": [{"label": p.label, "reason": p.reason} for p in outcome.space.pruned],
        "candidates": [
            {"label": v.label, "arch": v.arch, "settings": v.settings, "prior_rps": outcome.space.priors[v.label]}
            for v in outcome.space.candidates
        ],
        "plan": {"n0": outcome.plan.n0, "base_s": outcome.plan.base_s, "repeats": outcome.plan.repeats},
        "probes": probes,
        # The one capacity figure (tune's summary, `twinserve k8s --results`) and its basis; None where there is
        # no winner, or the winner has none (`capacity_note` says why).
        "capacity": None if summary.capacity is None else summary.capacity.to_dict(),
        "capacity_note": summary.no_capacity,
        # Every candidate of the search against the winner's load, with its numbers.
        "standings": [s.to_dict(goal) for s in summary.standings],
        "measured_candidates": summary.measured,
        "decision": {
            "winner": _ranked(d.winner),
            "runner_up": _ranked(d.runner_up),
            "samples": [_finite(s) for s in d.samples],
            "too_noisy": d.too_noisy,
            "stopped": d.stopped,
            # The winner's measurements as run (its last rung and each repeat), and as asked (--repeats).
            "repeats": {"run": summary.repeated, "asked": outcome.plan.repeats},
            "ranking": [_ranked(r) for r in d.ranking],
            "lines": summary.lines,
        },
        "serve_command": None if config is None else serve_command(config),
        # A model with settings of its own: what it had, the winner's [settings] for it, and the server's part.
        "model_repository": None if subject is None or subject.repository is None else str(subject.repository),
        "own_settings": subject.settings if per_model and subject is not None else None,
        "model_settings": winner_model_settings(outcome),
        "server_settings": server_level(d.winner.candidate) if per_model and d.winner is not None else None,
    }


# -- the report -----------------------------------------------------------------------------------------------
def _pareto_svg(record: dict[str, Any]) -> str:
    """Throughput (x) vs P95 (y), one point per probe, radius by memory, colour by architecture; the frontier
    (no other probe both faster and quicker) joined by a line."""
    slo = record["goal"]["slo_p95_ms"]
    points = [p for p in record["probes"] if p["latency_ms"]["p95"] is not None and p["throughput_rps"] > 0]
    width, height, m = 1080, 420, {"left": 70, "right": 20, "top": 20, "bottom": 50}
    if not points:
        return f'<svg class="plot" viewBox="0 0 {width} 80">{svg_text(width / 2, 40, "no measurements")}</svg>'
    cap = _Y_CAP_SLOS * slo
    xticks = linear_ticks(1.06 * max(p["throughput_rps"] for p in points))
    highest = max([slo, *(p["latency_ms"]["p95"] for p in points)])
    yticks = linear_ticks(min(cap, 1.06 * highest))
    x = Scale(0.0, xticks[-1], False, m["left"], width - m["right"])
    y = Scale(0.0, yticks[-1], False, height - m["bottom"], m["top"])
    memory_max = max((p["memory_mib"] for p in points), default=1.0) or 1.0
    out = [
        f'<svg class="plot" data-plot="pareto" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="throughput vs P95, marker size = memory">',
        f'<rect x="{m["left"]}" y="{m["top"]}" width="{width - m["left"] - m["right"]}" '
        f'height="{height - m["top"] - m["bottom"]}" class="frame"/>',
    ]
    for t in yticks:
        out.append(f'<line x1="{m["left"]}" x2="{width - m["right"]}" y1="{y(t):.1f}" y2="{y(t):.1f}" class="grid"/>')
        out.append(svg_text(m["left"] - 6, y(t) + 4, f"{t:g}", "end", "tick"))
    for t in xticks:
        out.append(svg_text(x(t), height - m["bottom"] + 16, f"{t:,.0f}", cls="tick"))
    out.append(svg_text(width / 2, height - 10, "throughput (responses / s)"))
    out.append(
        f'<text x="16" y="{height / 2:.0f}" text-anchor="middle" transform="rotate(-90 16 {height / 2:.0f})">'
        "P95 latency (ms)</text>"
    )
    out.append(f'<line x1="{m["left"]}" x2="{width - m["right"]}" y1="{y(slo):.1f}" y2="{y(slo):.1f}" class="slo"/>')
    out.append(svg_text(m["left"] + 6, y(slo) - 5, f"SLO p95 {slo:g} ms", "start", "slo-label"))
    frontier, best = [], math.inf
    for p in sorted(points, key=lambda p: (-p["throughput_rps"], p["latency_ms"]["p95"])):
        if p["latency_ms"]["p95"] < best:
            frontier.append(p)
            best = p["latency_ms"]["p95"]
    path = " ".join(f"{x(p['throughput_rps']):.1f},{y(min(p['latency_ms']['p95'], cap)):.1f}" for p in frontier)
    out.append(f'<polyline points="{path}" stroke="#555" stroke-dasharray="4 3" class="line"/>')
    for p in points:
        p95 = p["latency_ms"]["p95"]
        radius = 3 + 9 * math.sqrt(max(p["memory_mib"], 0.0) / memory_max)
        title = (
            f"{p['label']} · {p['stage']} · {p['rate_rps']:g} req/s asked · {p['throughput_rps']:,.0f}/s answered · "
            f"p95 {p95:.1f} ms · {p['memory_mib']:,.0f} MiB · {p['why']}"
        )
        colour = _ARCH_COLOURS.get(p["arch"], "#777")
        out.append(
            f'<circle class="point" cx="{x(p["throughput_rps"]):.1f}" cy="{y(min(p95, cap)):.1f}" r="{radius:.1f}" '
            f'fill="{colour}" fill-opacity="{0.85 if p["meets"] else 0.35}" data-arch="{p["arch"]}">'
            f"<title>{html.escape(title)}</title></circle>"
        )
    legend_x = m["left"] + 10
    for arch, colour in _ARCH_COLOURS.items():
        out.append(f'<circle cx="{legend_x}" cy="{m["top"] + 14}" r="5" fill="{colour}"/>')
        out.append(svg_text(legend_x + 10, m["top"] + 18, arch, "start"))
        legend_x += 80
    out.append(svg_text(legend_x, m["top"] + 18, "marker area: memory (PSS); faded: missed the goal", "start"))
    out.append("</svg>")
    return "\n".join(out)


def _report_html(record: dict[str, Any]) -> str:
    goal = record["goal"]
    facts = {
        "Model": f"{record['model_name']} ({record['model']})",
        "Goal": f"P95 <= {goal['slo_p95_ms']:g} ms"
        + (f", P99 <= {goal['slo_p99_ms']:g} ms" if goal["slo_p99_ms"] else "")
        + (f" at {goal['target_rps']:g} req/s" if goal["target_rps"] else ", the highest rate")
        + (f", memory <= {goal['max_memory_mib']:g} MiB" if goal["max_memory_mib"] else ""),
        "Machine": f"{record['machine'].get('hostname')} · {record['machine'].get('cpu_count')} CPUs",
        "Budget": f"{record['elapsed_s']:.0f} s used of {record['budget_s']:g} s",
        "Created": record["created"],
    }
    dl = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(str(v))}</dd>" for k, v in facts.items())
    lines = "".join(f"<li>{html.escape(line)}</li>" for line in record["decision"]["lines"])
    command = record["serve_command"]
    serve = f"<p><code>{html.escape(' '.join(command))}</code></p>" if command else ""
    search = "".join(f"<li>{html.escape(n)}</li>" for n in record["notes"])
    search += "".join(
        f"<li>pruned {html.escape(p['label'])}: {html.escape(p['reason'])}</li>" for p in record["pruned"]
    )
    headers = (
        "#", "candidate", "stage", "req/s asked", "answered/s", "p50", "p95", "p99", "errors", "MiB", "verdict", "log"
    )  # fmt: skip
    rows = []
    for p in record["probes"]:
        lat = p["latency_ms"]
        kinds = p.get("errors_by_kind") or {}
        cells = [
            str(p["n"]),
            p["label"],
            p["stage"],
            f"{p['rate_rps']:,.1f}",
            f"{p['throughput_rps']:,.1f}",
            *(f"{lat[k]:.1f}" if lat[k] is not None else "-" for k in ("p50", "p95", "p99")),
            f"{p['errors']:,}" + "".join(f"; {kind} {n:,}" for kind, n in kinds.items()),
            f"{p['memory_mib']:,.0f}",
            p["why"],
        ]
        log = p.get("log")
        link = f'<a href="{html.escape(log)}">{html.escape(Path(log).name)}</a>' if log else "-"
        rows.append(([*(html.escape(c) for c in cells), link], "" if p["meets"] else "err"))
    standings = [
        (
            [html.escape(s["label"]), html.escape(s["standing"].replace("_", " ")), str(s["probes"]),
             html.escape(s["text"])],
            "err" if s["standing"] in ("behind", "missed") else "",
        )
        for s in record.get("standings", [])
    ]  # fmt: skip
    capacity = record.get("capacity")
    basis = (
        f"<p>Capacity: {capacity['rate_rps']:,.1f} req/s: {html.escape(capacity['basis'])}.</p>"
        if capacity
        else (f"<p>No capacity: {html.escape(record['capacity_note'])}.</p>" if record.get("capacity_note") else "")
    )
    sections = [
        f"<section><h1>twinserve tune: {html.escape(record['model_name'])}</h1><dl>{dl}</dl></section>",
        f'<section class="advice"><h2>Decision</h2><ul>{lines}</ul>{basis}{serve}</section>',
        f"<section><h2>Throughput vs P95 (marker size: memory)</h2>{_pareto_svg(record)}</section>",
        f"<section><h2>Search</h2><ul>{search}</ul></section>",
        "<section><h2>Every candidate against the winner</h2>"
        f"{html_table(('candidate', 'standing', 'probes', 'evidence'), standings, {2})}</section>",
        f"<section><h2>Every probe</h2>{html_table(headers, rows, {0, 3, 4, 5, 6, 7, 9})}</section>",
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>twinserve tune: {html.escape(record['model_name'])}</title><style>{STYLE_SHEET}</style></head>"
        "<body><main>\n" + "\n".join(sections) + "\n</main></body></html>\n"
    )


def write_tune_outputs(outcome: TuneOutcome, out: Path, machine: dict[str, Any]) -> dict[str, Path]:
    """Write results.json, report.html and (when there is a winner) winner.toml; their paths by name."""
    out.mkdir(parents=True, exist_ok=True)
    record = tune_record(outcome, machine, out)
    written = {"results": out / "results.json", "report": out / "report.html"}
    written["results"].write_bytes(orjson.dumps(record, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    written["report"].write_text(_report_html(record), encoding="utf-8")
    config = winner_config(outcome)
    if config is not None:
        assert outcome.decision.winner is not None
        header = "\n".join(
            [
                f"twinserve tune {_subject_text(outcome)} ({datetime.date.today().isoformat()}): "
                f"{outcome.decision.winner.candidate.label}",
                *record["decision"]["lines"],
                "Serve with: twinserve serve --config THIS_FILE (flags override it)",
            ]
        )
        written["settings"] = out / "winner.toml"
        written["settings"].write_text(settings_file_text(config, header), encoding="utf-8")
    model_settings = winner_model_settings(outcome)
    if model_settings is not None:
        written["model_settings"] = out / "winner-model-settings.toml"
        written["model_settings"].write_text(_model_settings_text(outcome, model_settings), encoding="utf-8")
    return written
