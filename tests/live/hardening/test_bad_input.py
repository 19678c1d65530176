"""Hand-made nasties, sent as raw bytes, each with the exact answer expected from every architecture."""

from __future__ import annotations

import http.client
import json
import socket
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass

import pytest

from tests.conftest import ARCHS
from tests.errors import error_fields
from tests.live.hardening.conftest import MAX_BODY_BYTES, READ_TIMEOUT_S
from tests.serving import Server

IRIS = '{"sepal_length": %s, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}'
#: The declared V2 tensors of tests/models.py:Affine, sent as Triton binary data.
V2_HEADER = {
    "inputs": [
        {"name": "x", "shape": [1, 2], "datatype": "FP64", "parameters": {"binary_data_size": 16}},
        {"name": "scale", "shape": [1], "datatype": "FP64", "parameters": {"binary_data_size": 8}},
    ]
}
V2_DATA = struct.pack("<3d", 1.0, 2.0, 3.0)  # x = [[1, 2]], scale = [3]


def request(
    path: str, body: bytes, content_type: str = "application/json", length: int | None = None, **headers: str
) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Type: {content_type}"]
    head.append(f"Content-Length: {len(body) if length is None else length}")
    head.extend(f"{name.replace('_', '-')}: {value}" for name, value in headers.items())
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def v2_binary(header: Mapping[str, object], data: bytes, header_length: int | None = None) -> bytes:
    encoded = json.dumps(header).encode()
    length = len(encoded) if header_length is None else header_length
    return request(
        "/v2/models/affine/infer",
        encoded + data,
        "application/octet-stream",
        Inference_Header_Content_Length=str(length),
    )


def echo(body: bytes, length: int | None = None) -> bytes:
    return request("/v1/models/echo:predict", body, length=length)


@dataclass(frozen=True)
class Nasty:
    raw: bytes
    status: int
    code: str | None  # twinserve's error code (V1 bodies); None for V2 bodies, which carry a message only
    says: str  # a piece of the message (or, for a 200, of the body)


NASTIES: dict[str, Nasty] = {
    "deep nesting (100k [)": Nasty(
        echo(b'{"instances": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}"), 400, "malformed_json", "recursion limit"
    ),
    "NaN literal": Nasty(echo(b'{"instances": [NaN]}'), 400, "malformed_json", "not valid JSON"),
    "Infinity literal": Nasty(echo(b'{"instances": [-Infinity]}'), 400, "malformed_json", "not valid JSON"),
    "NaN in a typed field": Nasty(
        request("/v1/models/iris:predict", f'{{"instances": [{IRIS % "NaN"}]}}'.encode()), 400, "malformed_json", ""
    ),
    "1e400 (overflows a double)": Nasty(echo(b'{"instances": [1e400]}'), 400, "malformed_json", "infinity"),
    "10**5000, 5001 digits": Nasty(
        echo(b'{"instances": [1' + b"0" * 5000 + b"]}"), 400, "malformed_json", "number out of range"
    ),
    "NaN inside a string is fine": Nasty(echo(b'{"instances": ["NaN", "Infinity", "1e400"]}'), 200, None, '"1e400"'),
    "invalid UTF-8": Nasty(echo(b'{"instances": ["\xff\xfe"]}'), 400, "malformed_json", "unicode"),
    "duplicate keys (the last wins)": Nasty(
        echo(b'{"instances": [1], "instances": [2]}'), 200, None, '{"predictions":[2]}'
    ),
    "empty body": Nasty(echo(b""), 400, "malformed_json", "EOF"),
    "body one byte over --max-body-bytes": Nasty(
        echo(b'{"instances": ["' + b"a" * (MAX_BODY_BYTES - 18) + b'"]}'), 413, "payload_too_large", "--max-body-bytes"
    ),
    "huge Content-Length, small body": Nasty(echo(b'{"instances": [1]}', length=10**12), 413, "payload_too_large", ""),
    "V2: NaN literal": Nasty(
        request(
            "/v2/models/affine/infer",
            b'{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP64", "data": [NaN, 1]}]}',
        ),
        400,
        None,
        "not valid JSON",
    ),
    "V2: empty body": Nasty(request("/v2/models/affine/infer", b""), 400, None, "not valid JSON"),
    "V2 binary: well formed (control)": Nasty(v2_binary(V2_HEADER, V2_DATA), 200, None, '"data":[3.0,6.0]'),
    "V2 binary: 3 bytes short": Nasty(v2_binary(V2_HEADER, V2_DATA[:-3]), 400, None, "overruns the binary data"),
    "V2 binary: 2 bytes over": Nasty(v2_binary(V2_HEADER, V2_DATA + b"xx"), 400, None, "belong to no input"),
    "V2 binary: size that does not fit the shape": Nasty(
        v2_binary(
            {"inputs": [{**V2_HEADER["inputs"][0], "parameters": {"binary_data_size": 15}}, V2_HEADER["inputs"][1]]},
            V2_DATA[:-1],
        ),
        400,
        None,
        "15 binary bytes, but shape [1, 2] of FP64 takes 16",
    ),
    "V2 binary: header length past the body": Nasty(
        v2_binary(V2_HEADER, V2_DATA, header_length=99_999), 400, None, "Inference-Header-Content-Length"
    ),
    "V2 binary: negative header length": Nasty(
        v2_binary(V2_HEADER, V2_DATA, header_length=-5), 400, None, "Inference-Header-Content-Length"
    ),
}


def exchange(port: int, data: bytes, half_close: bool = False) -> tuple[int | None, bytes]:
    """Send `data` on a fresh connection; the response's status and body, or (None, b"") if the server closed the
    connection without one. A hang fails the test (socket timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5 * READ_TIMEOUT_S) as conn:
        conn.sendall(data)
        if half_close:
            conn.shutdown(socket.SHUT_WR)
        response = http.client.HTTPResponse(conn)
        try:
            response.begin()
        except http.client.RemoteDisconnected:
            return None, b""
        return response.status, response.read()


@pytest.mark.hardening
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", list(NASTIES))
def test_nasty_gets_its_exact_answer(arch: str, name: str, well_behaved: dict[str, Server]) -> None:
    nasty = NASTIES[name]
    status, body = exchange(well_behaved[arch].port, nasty.raw)
    assert status == nasty.status, body[:300]
    if nasty.status == 200:
        assert nasty.says.encode() in body, body[:300]
        return
    error = json.loads(body)["error"]
    if nasty.code is None:  # the V2 body: {"error": "message"}
        assert isinstance(error, str) and nasty.says in error, error
    else:
        error = error_fields(json.loads(body))
        assert error["code"] == nasty.code and nasty.says in error["message"], error


@pytest.mark.hardening
@pytest.mark.parametrize("arch", ARCHS)
def test_body_cut_short_of_its_content_length_is_never_computed(arch: str, well_behaved: dict[str, Server]) -> None:
    whole = b'{"instances": [1, 2]}'
    short = whole[:-2]  # still the start of a JSON document, not a whole one
    # The client half-closes before its body is whole: every server takes it for a client that left (RFC 9112
    # 8: an incomplete message), and closes the connection without an answer; the app never sees the request.
    status, body = exchange(well_behaved[arch].port, echo(short, length=len(whole)), half_close=True)
    assert status is None, body
    # A valid JSON document, shorter than announced: still not acted on.
    status, body = exchange(well_behaved[arch].port, echo(whole, length=len(whole) + 5), half_close=True)
    assert status is None, body


@pytest.mark.hardening
@pytest.mark.parametrize("arch", ARCHS)
def test_slow_body_gets_408_after_the_read_timeout(arch: str, well_behaved: dict[str, Server]) -> None:
    whole = b'{"instances": [1, 2]}'
    started = time.monotonic()
    status, body = exchange(well_behaved[arch].port, echo(whole[:5], length=len(whole)))  # then nothing more
    waited = time.monotonic() - started
    assert status == 408, body
    assert error_fields(json.loads(body))["code"] == "request_timeout"
    assert waited >= READ_TIMEOUT_S * 0.9  # it was the read timeout, not something sooner


@pytest.mark.hardening
@pytest.mark.parametrize("arch", ARCHS)
def test_slow_headers_are_cut_off_after_the_read_timeout(arch: str, well_behaved: dict[str, Server]) -> None:
    port = well_behaved[arch].port
    with socket.create_connection(("127.0.0.1", port), timeout=5 * READ_TIMEOUT_S) as conn:
        conn.sendall(b"POST /v1/models/echo:predict HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # the head never ends
        started = time.monotonic()
        closed = False
        while not closed and time.monotonic() - started < 4 * READ_TIMEOUT_S:
            try:  # a byte of header every half second, slowloris style: never a long pause
                conn.sendall(b"X")
                time.sleep(0.5)
                conn.setblocking(False)
                closed = conn.recv(1024) == b""
            except BlockingIOError:
                pass
            except (BrokenPipeError, ConnectionResetError):
                closed = True
            finally:
                conn.setblocking(True)
    assert closed, "the server still held the connection open while its head dribbled in"
    status, _ = exchange(port, echo(b'{"instances": [1]}'))
    assert status == 200  # and it serves everyone else as before
