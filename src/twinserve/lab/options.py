"""The runs as options to choose between: each `Option` is a run at the best level it reached within the SLO.

Kept apart from the advisor (`advise`), which ranks them, so that `advise.hybrid`, which compares the best async
and hybrid options, does not import the advisor that calls it.
"""

from __future__ import annotations

from dataclasses import dataclass

from twinserve.lab.results import Level, Run

__all__ = ["Option"]


@dataclass(frozen=True)
class Option:
    """A run at the best level it reached within the SLO."""

    run: Run
    level: Level

    @property
    def capacity(self) -> float:
        return self.level.throughput_rps

    @property
    def p95(self) -> float:
        return self.level.p("p95") or 0.0

    @property
    def memory_mib(self) -> float | None:
        """The server's peak PSS (RSS in results from before PSS was measured): what --max-memory-mib caps."""
        return self.level.resources.memory_mib if self.level.resources else None

    def describe(self) -> str:
        basis = self.level.resources.memory_basis if self.level.resources else ""
        memory = f", {self.memory_mib:,.0f} MiB {basis}" if self.memory_mib is not None else ""
        return f"{self.capacity:,.0f} req/s at {self.level.load_text} (P95 {self.p95:.1f} ms, no errors{memory})"
