"""Models for the hardening suite, served through the `path/file.py:Class` form of MODEL."""

from __future__ import annotations

import time
from typing import Any

import twinserve

#: Each predict call waits this long without holding the GIL, as a call to an accelerator or a remote model would:
#: capacity is then set by the model, not by the two CPU cores the tests share with the load generator.
PREDICT_SECONDS = 0.05


class Sleepy(twinserve.Model):
    """Doubles numbers, taking PREDICT_SECONDS per batch whatever its size."""

    def predict(self, batch: list[float]) -> list[float]:
        time.sleep(PREDICT_SECONDS)
        return [2 * x for x in batch]

    def examples(self) -> list[Any]:
        return [1.5, -2.0]
