"""RFC 9110 content codings, in every architecture, in process.

- §8.4 Content-Encoding: a request body coded with gzip or deflate (§8.4.1.2, §8.4.1.3; `x-gzip` is gzip) is
  decoded before it is read; a coding the server does not know is 415 (§15.5.16), naming the ones it does
  (`Accept-Encoding` on the 415, §12.5.3). `--max-body-bytes` bounds the decoded size as well: a small compressed
  body that inflates past it is 413 without being inflated whole.
- §12.5.3 Accept-Encoding: a response is gzipped only where the client gives gzip a q-value above 0 (by name or
  through `*`, a named coding winning over `*`); `Vary: Accept-Encoding` (§12.5.5) on a response that could be.
- Triton's binary extension sends `Inference-Header-Content-Length` for the uncompressed body; it is read after
  decoding (tritonclient's `request_compression_algorithm`).
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator

import numpy as np
import pytest

from tests.inprocess import ARCHS_IN_PROCESS, Answer, AsyncClient, SyncClient, served, served_per_arch
from tests.serving import model_path

MAX_BODY = 65536
MODELS = ("twinserve.examples.tabular:Classifier", model_path("Echo"))
SETOSA = {"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}
V1_BODY = json.dumps({"instances": [SETOSA]}).encode()
V2_BODY = json.dumps(
    {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [[5.1, 3.5, 1.4, 0.2]]}]}
).encode()

Client = SyncClient | AsyncClient


@pytest.fixture(scope="module")
def apps() -> Iterator[dict[str, Client]]:
    with served_per_arch(MODELS, max_body_bytes=MAX_BODY, threads=4) as built:
        yield built


@pytest.fixture(params=ARCHS_IN_PROCESS)
def app(request: pytest.FixtureRequest, apps: dict[str, Client]) -> Client:
    return apps[request.param]


def _deflate(data: bytes) -> bytes:
    return zlib.compress(data)  # "deflate" is the zlib format (RFC 9110 §8.4.1.2), as tritonclient sends it


CODERS = {"gzip": gzip.compress, "x-gzip": gzip.compress, "deflate": _deflate}


def _body(answer: Answer) -> bytes:
    """The decoded body: httpx (async clients) undoes gzip itself, werkzeug's test client does not."""
    return gzip.decompress(answer.body) if answer.body[:2] == b"\x1f\x8b" else answer.body


def _post(app: Client, path: str, body: bytes, coding: str, **headers: str) -> Answer:
    sent = {"Content-Type": "application/json", "Content-Encoding": coding, **headers}
    return app.request("POST", path, content=CODERS[coding](body), headers=sent)


@pytest.mark.parametrize("coding", sorted(CODERS))
def test_v1_coded_request_is_decoded(app: Client, coding: str) -> None:
    answer = _post(app, "/v1/models/iris:predict", V1_BODY, coding)
    assert answer.status == 200, answer.text
    assert (
        answer.json()
        == app.request(
            "POST", "/v1/models/iris:predict", content=V1_BODY, headers={"Content-Type": "application/json"}
        ).json()
    )


@pytest.mark.parametrize("coding", sorted(CODERS))
def test_v2_coded_request_is_decoded(app: Client, coding: str) -> None:
    answer = _post(app, "/v2/models/iris/infer", V2_BODY, coding)
    assert answer.status == 200, answer.text
    assert answer.json()["outputs"]


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_v2_binary_header_length_is_the_decoded_one(app: Client, coding: str) -> None:
    """The binary extension's header length counts uncompressed bytes, as tritonclient computes it."""
    header = json.dumps(
        {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": 16}}]}
    ).encode()
    raw = header + np.array([5.1, 3.5, 1.4, 0.2], dtype=np.float32).tobytes()
    answer = _post(
        app,
        "/v2/models/iris/infer",
        raw,
        coding,
        **{"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))},
    )
    assert answer.status == 200, answer.text


def test_stacked_codings_are_undone_last_first(app: Client) -> None:
    coded = gzip.compress(_deflate(V1_BODY))
    answer = app.request(
        "POST",
        "/v1/models/iris:predict",
        content=coded,
        headers={"Content-Type": "application/json", "Content-Encoding": "deflate, gzip"},
    )
    assert answer.status == 200, answer.text


def test_identity_is_no_coding(app: Client) -> None:
    answer = app.request(
        "POST",
        "/v1/models/iris:predict",
        content=V1_BODY,
        headers={"Content-Type": "application/json", "Content-Encoding": "identity"},
    )
    assert answer.status == 200, answer.text


def test_unknown_coding_is_415_naming_the_known_ones(app: Client) -> None:
    answer = app.request(
        "POST",
        "/v1/models/iris:predict",
        content=V1_BODY,
        headers={"Content-Type": "application/json", "Content-Encoding": "br"},
    )
    assert answer.status == 415
    assert answer.headers["accept-encoding"] == "gzip, deflate"


def test_corrupt_coded_body_is_400(app: Client) -> None:
    answer = app.request(
        "POST",
        "/v1/models/iris:predict",
        content=b"not gzip at all",
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert answer.status == 400
    truncated = gzip.compress(V1_BODY)[:-8]
    answer = app.request(
        "POST",
        "/v1/models/iris:predict",
        content=truncated,
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert answer.status == 400


@pytest.mark.parametrize("path", ["/v1/models/echo:predict", "/v2/models/iris/infer"])
def test_compression_bomb_is_413(app: Client, path: str) -> None:
    """A few KiB that inflate to 64 MiB: refused once the decoded size passes the limit."""
    bomb = gzip.compress(b"{" + b" " * (64 << 20) + b"}", compresslevel=9)
    assert len(bomb) < MAX_BODY
    answer = app.request(
        "POST", path, content=bomb, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"}
    )
    assert answer.status == 413
    assert b"payload_too_large" in answer.body or b"exceeds" in answer.body


def test_decoded_body_exactly_at_the_limit_is_read(app: Client) -> None:
    body = b'{"instances": [1]}'
    body = body[:-1] + b" " * (MAX_BODY - len(body)) + b"}"
    assert len(body) == MAX_BODY
    answer = _post(app, "/v1/models/echo:predict", body, "gzip")
    assert answer.status == 200, answer.text
    assert _post(app, "/v1/models/echo:predict", body[:-1] + b" }", "gzip").status == 413


BIG = {"instances": [{"x": "y" * 64}] * 40}  # a reply of a few KiB


@pytest.mark.parametrize(
    "accept", ["gzip", "gzip, deflate", "deflate;q=0.5, gzip;q=0.8", "*", "br, *;q=0.1", "GZIP", "x-gzip"]
)
def test_large_reply_gzipped_when_accepted(app: Client, accept: str) -> None:
    answer = app.request("POST", "/v1/models/echo:predict", json=BIG, headers={"Accept-Encoding": accept})
    assert answer.status == 200
    assert answer.headers["content-encoding"] == "gzip"
    assert "accept-encoding" in answer.headers["vary"].lower()
    assert json.loads(_body(answer)) == {"predictions": BIG["instances"]}


@pytest.mark.parametrize("accept", [None, "identity", "gzip;q=0", "*;q=0", "gzip;q=0, *", "deflate", "br"])
def test_large_reply_plain_unless_gzip_accepted(app: Client, accept: str | None) -> None:
    headers = {"Accept-Encoding": accept} if accept is not None else {"Accept-Encoding": ""}
    answer = app.request("POST", "/v1/models/echo:predict", json=BIG, headers=headers)
    assert answer.status == 200
    assert "content-encoding" not in answer.headers
    assert "accept-encoding" in answer.headers["vary"].lower()
    assert answer.json() == {"predictions": BIG["instances"]}


def test_small_reply_never_gzipped(app: Client) -> None:
    small = {"instances": [1]}
    answer = app.request("POST", "/v1/models/echo:predict", json=small, headers={"Accept-Encoding": "gzip"})
    assert answer.status == 200
    assert "content-encoding" not in answer.headers
    assert answer.json() == {"predictions": [1]}


def test_vary_names_both_with_cors() -> None:
    """A gzip-able reply under CORS varies on both Accept-Encoding and Origin, in one field, in every front."""
    seen = []
    for arch in ARCHS_IN_PROCESS:
        with served(arch, MODELS, cors_origins=["https://app.example"], threads=2) as client:
            answer = client.request(
                "POST", "/v1/models/echo:predict", json=BIG, headers={"Origin": "https://app.example"}
            )
            assert answer.status == 200
            seen.append(answer.headers["vary"])
    assert all(v == "Accept-Encoding, Origin" for v in seen), seen
