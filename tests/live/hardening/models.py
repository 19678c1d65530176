"""Models for the hardening suite, served through the `path/file.py:Class` form of MODEL."""

from __future__ import annotations

import time
from pathlib import Path
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


class Ledger(twinserve.Model):
    """Signs each instance `{"ledger": dir, "id": name}` in as begun (a file named `name` in `dir`), then takes
    PREDICT_SECONDS, or the longest `"seconds"` its instances ask for: the tests then know exactly which requests
    the server had begun computing."""

    def predict(self, batch: list[dict[str, Any]]) -> list[str]:
        for item in batch:
            (Path(item["ledger"]) / item["id"]).touch()
        time.sleep(max(float(item.get("seconds", PREDICT_SECONDS)) for item in batch))
        return [item["id"] for item in batch]
