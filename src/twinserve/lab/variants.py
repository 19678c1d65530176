"""What `twinserve bench` starts: the architectures and settings of each server, and how sweeps combine.

Kept apart from the bench itself so that the command line can offer the sweeps without importing the lab.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["SWEEPABLE", "Arch", "Variant", "variants"]

Arch = Literal["sync", "async", "hybrid"]

#: Settings `bench` can sweep, and the architectures each one means something for.
SWEEPABLE: dict[str, tuple[Arch, ...]] = {
    "workers": ("sync", "async", "hybrid"),
    "threads": ("sync",),
    "max_batch_size": ("sync", "async", "hybrid"),
    "max_batch_delay_ms": ("sync", "async", "hybrid"),
    "model_workers": ("hybrid",),
}


@dataclass(frozen=True)
class Variant:
    """One server configuration: an architecture and the settings it is started with."""

    arch: Arch
    settings: dict[str, Any]

    @property
    def label(self) -> str:
        shown = " ".join(f"{k.replace('_', '-')}={v}" for k, v in self.settings.items() if v is not None)
        return f"{self.arch} {shown}".strip()


def variants(archs: Sequence[Arch], sweeps: dict[str, Sequence[Any]]) -> list[Variant]:
    """Every architecture crossed with every combination of the swept settings that apply to it."""
    found: list[Variant] = []
    for arch in archs:
        names = [n for n, values in sweeps.items() if values and arch in SWEEPABLE[n]]
        for combo in itertools.product(*(sweeps[n] for n in names)):
            found.append(Variant(arch, dict(zip(names, combo, strict=True))))
    return found
