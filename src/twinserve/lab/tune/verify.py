"""`twinserve tune --verify URL`: a short open-loop Poisson run against a running deployment (the pilot), and a
pass/fail verdict with its evidence: P50/P95/P99 (from each request's scheduled send time), the rate achieved,
the errors by kind.

The same goal test as the search (`search.meets`), so a setting tune picked and a deployment verified are
judged alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twinserve.lab.loadgen import LevelResult, LoadSpec, run_level_sync
from twinserve.lab.servers import request_bodies
from twinserve.lab.tune.search import Goal, Probe, ProbeResult, meets
from twinserve.lab.variants import Variant

__all__ = ["Verification", "verify"]


@dataclass(frozen=True)
class Verification:
    url: str
    model_name: str
    goal: Goal
    rate: float
    seconds: float
    level: LevelResult
    passed: bool
    reason: str
    errors: dict[str, int] = field(default_factory=dict)

    def lines(self) -> list[str]:
        lat = self.level.latency_ms
        verdict = "PASS" if self.passed else "FAIL"
        slo = f"P95 <= {self.goal.slo_p95_ms:g} ms" + (
            f", P99 <= {self.goal.slo_p99_ms:g} ms" if self.goal.slo_p99_ms is not None else ""
        )

        def ms(name: str) -> str:
            value = lat.get(name)
            return "-" if value is None else f"{value:.1f}"

        errors = ", ".join(f"{kind} {count}" for kind, count in self.errors.items()) or "none"
        limited = "  (generator-limited)" if self.level.generator_limited else ""
        return [
            f"{verdict}: {self.url} ({self.model_name}) at {self.rate:g} req/s for {self.seconds:g} s, goal {slo}"
            + ("" if self.passed else f": {self.reason}"),
            f"  latency ms (from the scheduled send time): p50 {ms('p50')}  p95 {ms('p95')}  p99 {ms('p99')}",
            f"  sent {self.level.sent}, answered {self.level.throughput_rps:,.1f}/s, achieved rate "
            f"{self.level.achieved_rate or 0:,.1f}/s{limited}",
            f"  errors: {errors}",
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "model_name": self.model_name,
            "goal": vars(self.goal),
            "rate_rps": self.rate,
            "seconds": self.seconds,
            "passed": self.passed,
            "reason": self.reason,
            "errors": self.errors,
            "level": self.level.to_dict(),
        }


def verify(
    url: str,
    goal: Goal,
    rate: float,
    seconds: float,
    *,
    payload: Path | None = None,
    headers: Mapping[str, str] | None = None,
) -> Verification:
    """Drive `url`'s first model at `rate` req/s (Poisson) for `seconds`, after a short warm-up; judge it."""
    base = url.rstrip("/")
    name, bodies = request_bodies(base, payload, headers)
    spec = LoadSpec(
        url=f"{base}/v1/models/{name}:predict",
        bodies=bodies,
        duration_s=seconds,
        warmup_s=min(2.0, 0.2 * seconds),
        rate=rate,
        timeout_s=max(1.0, 10 * goal.slo_p95_ms / 1000),
        headers=dict(headers or {}),
        remote=True,  # a deployment is the point: the user named it
    )
    level = run_level_sync(spec)
    errors = level.errors_by_kind()  # "503 queue_full", "timeout", ...
    probe = Probe(Variant("async", {}), "verify", rate, seconds)  # the deployment's settings are its own
    result = ProbeResult(
        probe,
        level.sent,
        sum(errors.values()),
        level.achieved_rate or 0.0,
        level.throughput_rps,
        level.latency_ms.get("p50"),
        level.latency_ms.get("p95"),
        level.latency_ms.get("p99"),
        0.0,
        seconds,
        error_kinds=errors,
    )
    passed, reason = meets(result, Goal(goal.slo_p95_ms, goal.slo_p99_ms))  # memory: not ours to read remotely
    return Verification(base, name, goal, rate, seconds, level, passed, reason, errors)
