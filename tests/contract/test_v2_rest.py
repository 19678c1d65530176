"""The Open Inference Protocol's REST binding (KServe V2) as its clients expect it, in every architecture, in
process. What tritonclient itself does over a socket is in tests/conformance/test_tritonclient.py.

Rules, by source:
- Open Inference Protocol, "HTTP/REST": the server metadata is `GET v2`; there is no `v2/` route, and twinserve
  matches paths exactly (no trailing-slash redirect, which Flask and the ASGI dispatcher would answer differently):
  `GET /v2/` is 404 everywhere, with the V2 error body `{"error": "message"}` ("Errors": an error is a JSON object
  whose `error` is a string).
- "Tensor Data": JSON `data` of UINT64 holds values up to 2**64 - 1; a mix of values at or past 2**63 with smaller
  ones is exact (numpy alone would read it as float64 and lose the low bits).
- "Tensor Data": data must match its datatype: FP32 data holds JSON numbers (integers fill it), never `true` or a
  string such as `"1.5"` (numpy alone would read `[true, 1.5]` as `[1.0, 1.5]`): 400, as any datatype mismatch.
- Triton's binary data extension: a BYTES element is a 4-byte little-endian length and that many raw bytes, no
  encoding: an element that is not UTF-8 reaches a model that takes `bytes` as it was sent.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator

import pytest

from tests.inprocess import ARCHS_IN_PROCESS, AsyncClient, SyncClient, served_per_arch
from tests.serving import model_path

MODELS = ("twinserve.examples.tabular:Classifier", model_path("RawBytes"), model_path("Counters"))
BIG = 2**63

Client = SyncClient | AsyncClient


@pytest.fixture(scope="module")
def apps() -> Iterator[dict[str, Client]]:
    with served_per_arch(MODELS, threads=4) as built:
        yield built


@pytest.fixture(params=ARCHS_IN_PROCESS)
def app(request: pytest.FixtureRequest, apps: dict[str, Client]) -> Client:
    return apps[request.param]


def test_server_metadata_at_v2(app: Client) -> None:
    answer = app.request("GET", "/v2")
    assert answer.status == 200 and answer.json()["name"]


def test_v2_with_a_trailing_slash_is_404(app: Client) -> None:
    answer = app.request("GET", "/v2/")
    assert answer.status == 404
    assert list(answer.json()) == ["error"] and isinstance(answer.json()["error"], str)


@pytest.mark.parametrize("data", [[BIG, 1], [2**64 - 1, 0, BIG + 1], [BIG], [0, 1, 2]])
def test_uint64_json_data_is_exact(app: Client, data: list[int]) -> None:
    body = {"inputs": [{"name": "input", "datatype": "UINT64", "shape": [len(data)], "data": data}]}
    answer = app.request("POST", "/v2/models/counters/infer", json=body)
    assert answer.status == 200, answer.text
    (output,) = answer.json()["outputs"]
    assert output["datatype"] == "UINT64" and output["data"] == data


@pytest.mark.parametrize("data", [[2**64, 1], [-1, BIG], [BIG, 1.5], [BIG, "1"]])
def test_uint64_json_data_out_of_range_or_not_integers_is_400(app: Client, data: list[object]) -> None:
    body = {"inputs": [{"name": "input", "datatype": "UINT64", "shape": [len(data)], "data": data}]}
    answer = app.request("POST", "/v2/models/counters/infer", json=body)
    assert answer.status == 400, answer.text
    assert list(answer.json()) == ["error"]


@pytest.mark.parametrize(("data", "got"), [([5.1, True, 1.4, 0.2], "booleans"), ([5.1, "3.5", 1.4, 0.2], "strings")])
def test_fp32_data_takes_json_numbers_only(app: Client, data: list[object], got: str) -> None:
    tensor = {"name": "input", "datatype": "FP32", "shape": [1, 4]}
    answer = app.request("POST", "/v2/models/iris/infer", json={"inputs": [{**tensor, "data": data}]})
    assert answer.status == 400, answer.text
    assert answer.json() == {"error": f"input 'input': FP32 data must be numbers, got {got}"}
    integers = {"inputs": [{**tensor, "data": [5, 3, 1, 1]}]}  # JSON has no 5.0: integers fill floats
    assert app.request("POST", "/v2/models/iris/infer", json=integers).status == 200


def _binary_bytes(elements: list[bytes]) -> tuple[bytes, int]:
    raw = b"".join(struct.pack("<I", len(e)) + e for e in elements)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "BYTES",
                    "shape": [len(elements)],
                    "parameters": {"binary_data_size": len(raw)},
                }
            ]
        }
    ).encode()
    return header + raw, len(header)


def test_binary_bytes_elements_need_no_encoding(app: Client) -> None:
    elements = [b"\xff\xfe\x00raw", "héllo".encode(), b""]
    body, header_length = _binary_bytes(elements)
    answer = app.request(
        "POST",
        "/v2/models/raw-bytes/infer",
        content=body,
        headers={"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(header_length)},
    )
    assert answer.status == 200, answer.text
    (output,) = answer.json()["outputs"]
    assert output["data"] == [value for e in elements for value in (len(e), e[0] if e else -1)]


def test_truncated_binary_bytes_is_400(app: Client) -> None:
    body, header_length = _binary_bytes([b"abc"])
    answer = app.request(
        "POST",
        "/v2/models/raw-bytes/infer",
        content=body[:-1],
        headers={"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(header_length)},
    )
    assert answer.status == 400
