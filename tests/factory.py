"""Hand-made results files: known numbers for testing the report and the advisor."""

from __future__ import annotations

from typing import Any

from twinserve.lab.results import Level, Machine, Resources, Results, Run


def level(
    concurrency: int, rps: float, p95: float, *, rss: float = 300.0, errors: int = 0, cpu: float = 150.0
) -> Level:
    sent = max(int(rps * 5), errors + 1)
    return Level(
        mode="closed",
        concurrency=concurrency,
        duration_s=5.0,
        sent=sent,
        ok=sent - errors,
        http_errors={"503": errors} if errors else {},
        transport_errors={},
        throughput_rps=rps,
        latency_ms={
            "p50": p95 / 2,
            "p90": p95 * 0.9,
            "p95": p95,
            "p99": p95 * 1.5,
            "p999": p95 * 2,
            "max": p95 * 3,
            "mean": p95 / 2,
        },
        resources=Resources(
            samples=10, processes=2, rss_mib_mean=rss, rss_mib_max=rss, cpu_percent_mean=cpu, cpu_percent_max=cpu
        ),
    )


def run(label: str, arch: str, levels: list[Level], **settings: Any) -> Run:
    return Run(label=label, arch=arch, settings=settings, command=["twinserve", "serve", "--arch", arch], levels=levels)


def results(*runs: Run, slo: float | None = None) -> Results:
    return Results(
        created="2026-11-29T12:00:00Z",
        twinserve_version="0.1.0",
        machine=Machine(hostname="test", platform="linux", python="3.11", cpu_count=2, cpu_model="x", memory_mib=4096),
        versions={},
        model="twinserve.examples.tabular:Classifier",
        model_name="iris",
        payload="examples",
        duration_s=5.0,
        warmup_s=1.0,
        slo_p95_ms=slo,
        runs=list(runs),
    )
