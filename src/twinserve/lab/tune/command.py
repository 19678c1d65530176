"""`twinserve tune`'s handler: progress (one line per probe), the files written, the command line printed; and
`--verify URL`, the pilot run."""

from __future__ import annotations

import argparse
import datetime
import shlex
import signal
import sys
from pathlib import Path

from twinserve.config import DEFAULT_MODEL
from twinserve.core.threads import usable_cores
from twinserve.errors import ConfigError
from twinserve.lab.tune.search import Goal, Plan, ProbeResult, meets
from twinserve.lab.tune.subject import TuneSubject

__all__ = ["run_tune_command"]


def _goal(args: argparse.Namespace) -> Goal:
    return Goal(args.slo_p95_ms, args.slo_p99_ms, args.target_rps, args.max_memory_mib)


def _headers(pairs: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition(":")
        if not sep or not name.strip():
            raise ConfigError(f"--header: expected NAME:VALUE, got {pair!r}")
        headers[name.strip()] = value.strip()
    return headers


def _verify(args: argparse.Namespace) -> int:
    import orjson
    from rich.console import Console

    from twinserve.lab.tune.verify import verify

    if args.rate is None:
        raise ConfigError("--verify needs --rate: the requests per second to drive the deployment at")
    console = Console(width=None if sys.stdout.isatty() else 160, highlight=False)
    console.print(f"[bold]twinserve tune --verify[/] {args.verify}: {args.rate:g} req/s for {args.seconds:g} s")
    try:
        outcome = verify(
            args.verify, _goal(args), args.rate, args.seconds, payload=args.payload, headers=_headers(args.header)
        )
    except (OSError, ValueError) as exc:  # httpx's errors are OSErrors' kin only in part: name the failure
        raise ConfigError(f"--verify {args.verify}: {exc}") from None
    except Exception as exc:
        if exc.__class__.__module__.startswith("httpx"):
            raise ConfigError(f"--verify {args.verify}: {exc.__class__.__name__}: {exc}") from None
        raise
    first, *rest = outcome.lines()
    console.print(first, style="bold green" if outcome.passed else "bold red")
    for line in rest:
        console.print(line)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / "verify.json"
        path.write_bytes(orjson.dumps(outcome.to_dict(), option=orjson.OPT_INDENT_2))
        console.print(f"Wrote {path}")
    return 0 if outcome.passed else 1


def _probe_line(number: int, result: ProbeResult, spent: float, budget: float, plan: Plan) -> str:
    ok, why = meets(result, plan.goal)
    p = result
    latency = (
        f"p50 {p.p50_ms or 0:>6.1f}  p95 {p.p95_ms or 0:>6.1f}  p99 {p.p99_ms or 0:>6.1f} ms"
        if p.p95_ms is not None
        else "no responses".ljust(40)
    )
    mark = "[green]meets[/]" if ok else f"[red]{why}[/]"
    if p.generator_limited:
        mark += " [yellow](generator-limited)[/]"
    return (
        f"{number:>3} {spent:>5.0f}/{budget:<4.0f}s {p.probe.stage:<8} {p.probe.candidate.label:<52} "
        f"{p.probe.rate:>8,.1f}/s x {p.probe.seconds:g}s  {latency}  {p.memory_mib:>5,.0f} MiB  {mark}"
    )


def run_tune_command(args: argparse.Namespace) -> int:
    if args.verify is not None:
        return _verify(args)
    from rich.console import Console
    from rich.markup import escape

    from twinserve.lab.bench import this_machine
    from twinserve.lab.settings_writer import serve_command
    from twinserve.lab.tune.report import decision_lines, winner_config, write_tune_outputs
    from twinserve.lab.tune.runner import TuneRequest, run_tune
    from twinserve.lab.tune.subject import subject

    if args.model_repository is not None and args.model is not None:
        raise ConfigError("MODEL and --model-repository are exclusive: tune one or the other")
    if args.repository_model is not None and args.model_repository is None:
        raise ConfigError("--model NAME names a folder of --model-repository DIR: pass both (or MODEL alone)")
    # A bad MODEL or folder: one line, before anything starts.
    tuned = subject(args.model or DEFAULT_MODEL, args.model_repository, args.repository_model)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # unwinds: servers are stopped
    console = Console(width=None if sys.stdout.isatty() else 200, highlight=False)
    out: Path = args.out or Path("twinserve-tune") / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    name, bodies = tuned.name, tuned.bodies
    if args.payload is not None:
        bodies = _payload(args.payload)
    if not bodies:
        raise ConfigError(f"model {name!r} has no examples() to send: pass --payload FILE (one body per line)")
    request = TuneRequest(
        model=tuned.model,
        goal=_goal(args),
        budget_s=args.budget_s,
        bodies=bodies,
        archs=args.arch,
        repeats=args.repeats,
        min_probe_s=args.probe_seconds,
        log_dir=out / "logs",
        ready_timeout_s=args.ready_timeout,
        ceiling_budget_s=min(1.0, max(0.1, args.budget_s / 100)),
        subject=tuned,
    )
    goal = request.goal
    console.print(
        f"[bold]twinserve tune[/] {escape(_what(tuned))}: P95 <= {goal.slo_p95_ms:g} ms"
        + (f" at {goal.target_rps:g} req/s" if goal.target_rps else ", the highest rate")
        + f", budget {args.budget_s:g} s -> {out}"
    )

    def on_probe(number: int, result: ProbeResult, spent: float, plan: Plan) -> None:
        if number == 1:
            console.print(
                f"  {len(plan.candidates)} candidates, {plan.n0} at rung 0, {plan.base_s:g} s probes doubling each "
                f"rung, winner repeated {plan.repeats}x"
            )
        console.print(_probe_line(number, result, spent, args.budget_s, plan))

    outcome = run_tune(request, name, usable_cores(), on_probe)
    machine = this_machine().model_dump()
    written = write_tune_outputs(outcome, out, machine)
    console.print()
    for note in outcome.space.notes:
        console.print(f"  {escape(note)}")
    for pruned in outcome.space.pruned:
        console.print(f"  pruned {escape(pruned.label)}: {escape(pruned.reason)}")
    console.print()
    lines = decision_lines(outcome)
    console.print(escape(lines[0]), style="bold green" if outcome.decision.winner else "bold red")
    for line in lines[1:]:
        doubt = any(words in line for words in ("too close to call", "not searched", "no capacity", "ran out"))
        console.print(escape(line), style="yellow" if doubt else None)
    console.print(f"\nWrote {', '.join(str(p) for p in written.values())}")
    config = winner_config(outcome)
    if config is None:
        return 1
    if "model_settings" in written:
        assert tuned.settings is not None
        target = (
            tuned.repository / tuned.name / "twinserve.toml"
            if tuned.repository is not None
            else f"{tuned.model}.settings"
        )
        console.print(
            f"\n[bold]Set the model's own settings[/] (in {escape(str(target))}), from {written['model_settings']}:"
        )
        for line in written["model_settings"].read_text(encoding="utf-8").splitlines():
            if not line.startswith("#"):
                console.print(f"  {escape(line)}")
    console.print("\n[bold]Serve it with[/]")
    console.print(f"  twinserve serve --config {shlex.quote(str(written['settings']))}")
    console.print(f"  {escape(shlex.join(serve_command(config)))}")
    return 0


def _what(tuned: TuneSubject) -> str:
    if tuned.repository is not None:
        return f"{tuned.name} of {tuned.repository}"
    return tuned.model


def _payload(path: Path) -> list[bytes]:
    import orjson

    try:
        lines = [line.strip() for line in path.read_bytes().splitlines() if line.strip()]
        bodies = [orjson.dumps(orjson.loads(line)) for line in lines]
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ConfigError(f"--payload: {path}: {exc}") from None
    if not bodies:
        raise ConfigError(f"--payload: {path}: no request bodies (one JSON object per line)")
    return bodies
