"""`twinserve bench`, `twinserve advise`, `twinserve tune` and `twinserve locustfile`: arguments, progress, files
written (tune's handler is `twinserve.lab.tune.command`)."""

from __future__ import annotations

import argparse
import datetime
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from twinserve.errors import ConfigError
from twinserve.lab.variants import SWEEPABLE, Arch

if TYPE_CHECKING:
    from rich.console import Console

    from twinserve.lab.plan import BenchTarget
    from twinserve.lab.results import Results, Run

__all__ = ["add_advise", "add_bench", "add_locustfile", "add_tune"]

DEFAULT_MODEL = "twinserve.examples.tabular:Classifier"


def _list(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    def parse(text: str) -> list[Any]:
        try:
            values = [kind(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}") from None
        if not values or any(v <= 0 for v in values if isinstance(v, int | float)):
            raise argparse.ArgumentTypeError(f"expected positive values, got {text!r}")
        return values

    return parse


def _url(text: str) -> str:
    if not text.startswith(("http://", "https://")) or len(text.split("://", 1)[1].strip("/")) == 0:
        raise argparse.ArgumentTypeError(f"expected an http:// or https:// URL, got {text!r}")
    return text.rstrip("/")


def _archs(text: str) -> list[Arch]:
    archs = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in archs if a not in get_args(Arch)]
    if unknown or not archs:
        raise argparse.ArgumentTypeError(f"architectures are sync, async, hybrid; got {text!r}")
    return archs  # type: ignore[return-value]


def _add_subject(parser: argparse.ArgumentParser, repository_help: str, model_help: str) -> None:
    """What bench and tune measure: MODEL, or a model repository (`--model-repository DIR`, `--model NAME`)."""
    parser.add_argument("model", nargs="?", metavar="MODEL", help=f"default {DEFAULT_MODEL}")
    parser.add_argument("--model-repository", type=Path, metavar="DIR", help=repository_help)
    parser.add_argument("--model", dest="repository_model", metavar="NAME", help=model_help)


def add_bench(bench: argparse.ArgumentParser) -> None:
    bench.description = (
        "Start MODEL (or a model repository) under each architecture (and setting) as a real server on 127.0.0.1, "
        "drive every load level against it, and write results.json, report.html and plots."
    )
    _add_subject(
        bench,
        "serve this model repository instead of MODEL and drive each model's default version in turn",
        "with --model-repository: only this model",
    )
    bench.add_argument(
        "--version",
        dest="repository_version",
        metavar="V",
        help="with --model: this version, over the versioned routes (default: the default version, unversioned)",
    )
    bench.add_argument("--arch", type=_archs, default=["sync", "async", "hybrid"], help="default sync,async,hybrid")
    bench.add_argument("--concurrency", type=_list(int), help="closed-loop levels: connections (default 1,8,32,128)")
    bench.add_argument("--rate", type=_list(float), help="open-loop levels: req/s with --arrivals")
    bench.add_argument("--arrivals", choices=["poisson", "constant"], default="poisson")
    bench.add_argument("--duration", type=float, default=10.0, metavar="SECONDS", help="measured seconds per level")
    bench.add_argument("--warmup", type=float, default=2.0, metavar="SECONDS", help="unmeasured seconds per level")
    bench.add_argument("--out", type=Path, help="default ./twinserve-results/<timestamp>")
    bench.add_argument("--payload", type=Path, metavar="FILE", help="request bodies, one JSON object per line")
    bench.add_argument("--slo-p95-ms", type=float, help="advise for this P95 objective")
    bench.add_argument("--driver", choices=["twinserve", "wrk", "locust", "perf_analyzer"], default="twinserve")
    bench.add_argument(
        "--protocol",
        choices=["v1", "v2", "grpc"],
        default="v1",
        help="v1 :predict, v2 /infer (JSON tensors), or grpc (--grpc-port; with --driver perf_analyzer)",
    )
    bench.add_argument("--ready-timeout", type=float, default=300.0, metavar="SECONDS")
    bench.add_argument(
        "--ceiling-sizes", type=_list(int), default=[1, 8, 32], help="batch sizes timed in-process (default 1,8,32)"
    )
    for name in SWEEPABLE:
        kind: Callable[[str], Any] = float if name == "max_batch_delay_ms" else int
        bench.add_argument(
            "--" + name.replace("_", "-"),
            type=_list(kind),
            help=f"sweep: comma-separated values ({', '.join(SWEEPABLE[name])})",
        )
    bench.set_defaults(handler=_bench)


def add_advise(adv: argparse.ArgumentParser) -> None:
    adv.description = (
        "Read a results.json (or the folder holding it) and pick the highest throughput whose P95 meets "
        "the objective, ties broken by memory."
    )
    adv.add_argument("results", type=Path, metavar="RESULTS")
    adv.add_argument("--slo-p95-ms", type=float, help="P95 objective (default: the one bench was given, else 200)")
    adv.add_argument("--target-rps", type=float, help="throughput the choice must reach")
    adv.add_argument(
        "--max-memory-mib", type=float, help="memory the choice may use: the server's peak PSS, its whole process tree"
    )
    adv.set_defaults(handler=_advise)


def _positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    from twinserve.cli_args import positive

    return positive(kind)


def add_tune(tune: argparse.ArgumentParser) -> None:
    tune.description = (
        "Search the settings (architecture, workers, threads, batch size and delay, model workers) that meet a "
        "latency objective under open-loop Poisson load, a real server per candidate, pruned by the model's "
        "in-process batch curve, then successive halving; write the winner as a `twinserve serve --config` file "
        "(and, for a model with per-model settings, its [settings] table), every probe to results.json and "
        "report.html. With --verify URL: a short pilot run against a deployment."
    )
    _add_subject(
        tune,
        "tune one model of this repository (--model NAME): its [settings] are the search's start, the winner's "
        "go to winner-model-settings.toml",
        "with --model-repository: its folder",
    )
    tune.add_argument("--slo-p95-ms", type=_positive(float), required=True, help="P95 objective")
    tune.add_argument("--slo-p99-ms", type=_positive(float), help="P99 objective too")
    tune.add_argument("--target-rps", type=_positive(float), help="the rate to meet it at (default: the highest)")
    tune.add_argument("--max-memory-mib", type=_positive(float), help="peak PSS of the whole server process tree")
    tune.add_argument("--budget-s", type=_positive(float), default=300.0, help="seconds the search may take")
    tune.add_argument("--out", type=Path, help="default ./twinserve-tune/<timestamp>")
    tune.add_argument("--arch", type=_archs, default=["sync", "async", "hybrid"], help="default sync,async,hybrid")
    tune.add_argument("--repeats", type=_positive(int), default=3, help="times the winner is measured (default 3)")
    tune.add_argument(
        "--probe-seconds", type=_positive(float), default=1.0, help="the shortest probe, rung 0 (default 1)"
    )
    tune.add_argument("--payload", type=Path, metavar="FILE", help="request bodies, one JSON object per line")
    tune.add_argument("--ready-timeout", type=_positive(float), default=120.0, metavar="SECONDS")
    tune.add_argument("--verify", type=_url, metavar="URL", help="pilot: load this running server instead")
    tune.add_argument("--rate", type=_positive(float), help="--verify: requests per second (Poisson)")
    tune.add_argument("--seconds", type=_positive(float), default=10.0, help="--verify: measured seconds")
    tune.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="--verify: a header for every request (Authorization: Bearer KEY); repeatable",
    )
    tune.set_defaults(handler=_tune)


def _tune(args: argparse.Namespace) -> int:
    from twinserve.lab.tune.command import run_tune_command

    return run_tune_command(args)


def add_locustfile(loc: argparse.ArgumentParser) -> None:
    loc.add_argument("model", nargs="?", default=DEFAULT_MODEL, metavar="MODEL")
    loc.add_argument("-o", "--output", type=Path, default=Path("locustfile.py"))
    loc.add_argument(
        "--host", type=_url, metavar="URL", help="the server the file targets (locust's --host overrides it)"
    )
    loc.set_defaults(handler=_locustfile)


def _print_advice(console: Console, results: Results, slo: float, target: float | None, memory: float | None) -> None:
    from twinserve.lab.advise import advise

    advice = advise(results, slo, target, memory)
    style = "bold green" if advice.meets else "bold red"
    console.print(advice.lines[0], style=style)
    for line in advice.lines[1:]:
        console.print(line)


def _level_seconds(duration_s: float, warmup_s: float) -> str:
    """A level's time in words: "3 s after a 2 s warm-up" (the load runs through both; only the 3 s count)."""
    return f"{duration_s:g} s after a {warmup_s:g} s warm-up" if warmup_s else f"{duration_s:g} s"


def _bench(args: argparse.Namespace) -> int:
    import orjson
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from twinserve.lab.advise import advise
    from twinserve.lab.bench import run_bench
    from twinserve.lab.drivers import check_driver
    from twinserve.lab.plan import BenchPlan
    from twinserve.lab.report import print_summary, write_report
    from twinserve.lab.variants import variants
    from twinserve.lab.verdicts import ARTICLE
    from twinserve.model import import_model

    # A bad MODEL or repository, a missing extra or tool: one line, before any server starts.
    repository, targets = _bench_targets(args)
    if repository is None:
        import_model(args.model)
    check_driver(args.driver, args.protocol)
    # A stopped bench must stop the servers it started: SIGTERM unwinds through their context managers.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    console = Console(width=None if sys.stdout.isatty() else 160)
    out: Path = args.out or Path("twinserve-results") / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    concurrency = args.concurrency or ([] if args.rate else [1, 8, 32, 128])
    sweeps = {name: getattr(args, name) or [] for name in SWEEPABLE}
    plan = BenchPlan(
        model=args.model,
        variants=variants(args.arch, sweeps),
        out=out,
        concurrency=concurrency,
        rates=args.rate or [],
        arrivals=args.arrivals,
        duration_s=args.duration,
        warmup_s=args.warmup,
        payload=args.payload,
        slo_p95_ms=args.slo_p95_ms,
        driver=args.driver,
        protocol=args.protocol,
        ceiling_sizes=args.ceiling_sizes,
        ready_timeout_s=args.ready_timeout,
        repository=repository,
        targets=targets,
    )
    per_level = plan.duration_s + plan.warmup_s
    measured = max(len(targets), 1)
    total = len(plan.variants) * (measured * len(plan.levels()) * per_level + 1.0)
    what = plan.model if repository is None else f"{plan.model} ({', '.join(t.describe() for t in targets)})"
    console.print(
        f"[bold]twinserve bench[/] {what}: {len(plan.variants)} server(s) x {measured * len(plan.levels())} "
        f"level(s), {_level_seconds(plan.duration_s, plan.warmup_s)} each -> {out}"
    )

    def finished(run: Run) -> None:
        for lv in run.levels:
            errors = f"[red]{lv.errors} errors[/]" if lv.errors else "0 errors"
            p = lv.latency_ms
            console.print(
                f"  {run.label:<28} {lv.load:>7g} {'conns' if lv.mode == 'closed' else 'req/s':<5} "
                f"{lv.throughput_rps:>9,.0f} req/s  p50 {p.get('p50') or 0:>7.1f}  p95 {p.get('p95') or 0:>7.1f}  "
                f"p99 {p.get('p99') or 0:>7.1f} ms  {errors}"
                + ("  [yellow](generator-limited)[/]" if lv.generator_limited else "")
            )
        if run.error:
            console.print(f"  [red]{run.label}: {run.error.splitlines()[0]}[/]")

    if not console.is_terminal:  # a log or a CI job: one plain line per step, no bar redrawn in place
        steps = {"start": "starting", "idle": "idle memory", "level": "measuring", "ceiling": "measuring"}

        def lines(event: str, label: str, level: str | None, seconds: float) -> None:
            if event == "failed":
                console.print(f"x {label}: failed" + (f" ({level})" if level else ""), highlight=False)
            elif event in steps:
                what = f"{steps[event]} {level}" if level else steps[event]
                if event == "level":  # `seconds` is the warm-up and the measurement: say which is which
                    seconds_text = _level_seconds(plan.duration_s, plan.warmup_s)
                else:
                    seconds_text = f"{seconds:g} s" if seconds else ""
                console.print(f"- {label}: {what}" + (f" ({seconds_text})" if seconds_text else ""), highlight=False)

        results = run_bench(plan, lines, finished)
    else:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TimeRemainingColumn(),
            console=console,
        ) as bar:
            task = bar.add_task("starting", total=total)
            step: dict[str, Any] = {"length": 0.0}

            def progress(event: str, label: str, level: str | None, seconds: float) -> None:
                bar.advance(task, step["length"])  # the step before this one is over
                step["length"] = seconds
                if event == "failed":
                    console.print(f"[red]x {label}: failed[/]" + (f" ({level})" if level else ""))
                elif event == "done":
                    step["length"] = 0.0
                bar.update(task, description=f"{label} · {level}" if level else f"{label} · {event}")

            results = run_bench(plan, progress, finished)
            bar.update(task, completed=total, description="done")
    (out / "results.json").write_bytes(orjson.dumps(results.model_dump(mode="json"), option=orjson.OPT_INDENT_2))
    slo = args.slo_p95_ms
    advice_lines = advise(results, slo).lines if slo is not None else []
    write_report(results, out, advice_lines)
    print_summary(results, console)
    console.print(f"\n[bold]The claims of the article {ARTICLE!r} (points S1..S27) on this model and machine[/]")
    for verdict in results.verdicts:
        mark = {True: "[green]holds[/]", False: "[red]does not hold[/]", None: "[yellow]can't tell[/]"}[verdict.holds]
        magnitude = f" (claimed {verdict.claimed}, measured {verdict.measured})" if verdict.claimed else ""
        console.print(
            f"  {verdict.source} {verdict.claim}{magnitude}: {mark} — {verdict.evidence}", markup=True, highlight=False
        )
    if slo is not None:
        console.print(f"\n[bold]Advice for P95 <= {slo:g} ms[/]")
        _print_advice(console, results, slo, None, None)
    console.print(f"\nWrote {out / 'results.json'} and {out / 'report.html'}")
    return 0 if all(r.error is None for r in results.runs) else 1


def _bench_targets(args: argparse.Namespace) -> tuple[Path | None, list[BenchTarget]]:
    """`--model-repository` and what of it to measure (none: MODEL, set to its default here); ConfigError when the
    flags disagree or name what the repository does not have."""
    from twinserve.lab.bench import repository_targets

    repository: Path | None = args.model_repository
    if repository is None:
        if args.repository_model is not None or args.repository_version is not None:
            raise ConfigError("--model and --version choose within a --model-repository")
        args.model = args.model or DEFAULT_MODEL
        return None, []
    if args.model is not None:
        raise ConfigError("MODEL and --model-repository are exclusive: bench one or the other")
    if not repository.is_dir():
        raise ConfigError(f"--model-repository: {repository} is not a folder")
    if args.repository_version is not None and args.driver == "perf_analyzer":
        raise ConfigError("--version: perf_analyzer drives a model's default version only")
    args.model = str(repository)
    return repository, repository_targets(repository, args.repository_model, args.repository_version)


def _advise(args: argparse.Namespace) -> int:
    from rich.console import Console

    from twinserve.lab.tune.results import load_measured

    try:
        # bench's results, or tune's winner as one run at the capacity tune stated (the figure k8s sizes on too)
        results = load_measured(args.results, args.slo_p95_ms).results
    except (OSError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    slo = args.slo_p95_ms or results.slo_p95_ms or 200.0
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(f"[bold]Advice for P95 <= {slo:g} ms[/] ({results.model_name}, {results.machine.cpu_count} cores)")
    _print_advice(console, results, slo, args.target_rps, args.max_memory_mib)
    return 0


def _locustfile(args: argparse.Namespace) -> int:
    import orjson

    from twinserve.lab.drivers import locustfile_source
    from twinserve.model import ModelSpec, import_model
    from twinserve.protocol.v1 import json_default

    spec = ModelSpec(import_model(args.model)())
    examples = spec.examples()
    if not examples:
        raise ConfigError(f"model {spec.name!r} has no examples() to send")
    bodies = [orjson.dumps({"instances": [e]}, default=json_default) for e in examples]
    args.output.write_text(locustfile_source(f"/v1/models/{spec.name}:predict", bodies, args.host))
    print(f"wrote {args.output}: locust -f {args.output}" + ("" if args.host else " --host http://127.0.0.1:8000"))
    return 0
