"""The protocols' own clients, unmodified, against a real server in every architecture (one at a time).

- NVIDIA's `tritonclient.http` with `request_compression_algorithm` gzip and deflate (RFC 9110 §8.4: the body
  is coded, `Inference-Header-Content-Length` counts the uncoded bytes) and `response_compression_algorithm`
  gzip (§12.5.3), in JSON and binary tensors, and BYTES elements that are not UTF-8 (the binary data extension).
- KServe's V1 protocol and TF-Serving's REST API, as their clients send them, over httpx: the KServe SDK
  (`pip install kserve`) would pull protobuf 6, psutil 5.9, pandas and kubernetes into the project's environment
  and move pins other parts rely on, so its documented shapes are sent instead. `curl -d` is the form type.
- A compressed bomb over a real socket: 413 with the server alive after it.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.http as triton

from tests.conftest import ARCHS
from tests.serving import HTTP, Server, model_path

SETOSA = {"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}
VIRGINICA = {"sepal_length": 6.3, "sepal_width": 3.3, "petal_length": 6.0, "petal_width": 2.5}
MAX_BODY = 65536


@pytest.fixture(scope="module", params=ARCHS)
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    models = ["twinserve.examples.tabular:Classifier", model_path("RawBytes")]
    with Server(models, request.param, "--workers", "1", "--max-body-bytes", str(MAX_BODY)) as started:
        yield started


@pytest.fixture
def client(server: Server) -> Iterator[triton.InferenceServerClient]:
    with triton.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=30) as http:
        yield http


def _iris(binary: bool) -> triton.InferInput:
    array = np.array([list(SETOSA.values()), list(VIRGINICA.values())], dtype=np.float32)
    tensor = triton.InferInput("input", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_tritonclient_compressed_requests(client: triton.InferenceServerClient, coding: str, binary: bool) -> None:
    plain = client.infer("iris", [_iris(binary)])
    coded = client.infer("iris", [_iris(binary)], request_compression_algorithm=coding)
    assert coded.as_numpy("label").tolist() == plain.as_numpy("label").tolist()


def test_tritonclient_gzip_response(client: triton.InferenceServerClient) -> None:
    rows = np.array([list(SETOSA.values())] * 200, dtype=np.float32)  # a reply past the gzip threshold
    tensor = triton.InferInput("input", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows, binary_data=False)
    answer = client.infer("iris", [tensor], request_compression_algorithm="gzip", response_compression_algorithm="gzip")
    assert len(answer.as_numpy("label")) == 200


def test_tritonclient_raw_bytes(client: triton.InferenceServerClient) -> None:
    tensor = triton.InferInput("input", [2], "BYTES")
    tensor.set_data_from_numpy(np.array([b"\xff\x00\xfe", b"ok"], dtype=object), binary_data=True)
    answer = client.infer("raw-bytes", [tensor])
    assert answer.as_numpy("output").tolist() == [[3, 0xFF], [2, ord("o")]]


def test_gzip_bomb_refused_and_server_alive(server: Server) -> None:
    bomb = gzip.compress(b"[" + b" " * (32 << 20) + b"]", compresslevel=9)
    assert len(bomb) < MAX_BODY
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    refused = HTTP.post(f"{server.url}/v1/models/iris:predict", content=bomb, headers=headers, timeout=30)
    assert refused.status_code == 413 and refused.json()["code"] == "payload_too_large"
    assert HTTP.get(f"{server.url}/v2/health/ready", timeout=30).status_code == 200


def test_kserve_v1_client_shapes(server: Server) -> None:
    """What KServe's V1 client reads: liveness at `/`, names at /v1/models, `error` as the message string."""
    assert HTTP.get(f"{server.url}/", timeout=30).json() == {"status": "alive"}
    assert HTTP.get(f"{server.url}/v1/models", timeout=30).json() == {"models": ["iris", "raw-bytes"]}
    missing = HTTP.post(f"{server.url}/v1/models/nope:predict", json={"instances": [SETOSA]}, timeout=30)
    assert missing.status_code == 404 and isinstance(missing.json()["error"], str)


def test_tf_serving_curl_examples(server: Server) -> None:
    """TF-Serving's guide: `curl -d '{"instances": ...}' .../versions/1:predict` and the columnar form."""
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    rows = HTTP.post(
        f"{server.url}/v1/models/iris/versions/1:predict",
        content=b'{"instances": [%s]}' % httpx.Request("POST", "/", json=SETOSA).content,
        headers=form,
        timeout=30,
    )
    assert rows.status_code == 200, rows.text
    columns = {"inputs": {name: [value] for name, value in SETOSA.items()}}
    columnar = HTTP.post(f"{server.url}/v1/models/iris:predict", json=columns, timeout=30)
    assert columnar.status_code == 200 and "outputs" in columnar.json()
