"""Print, as a Markdown table, the status every architecture returns for each endpoint and error case.

Starts one real server per architecture on loopback (plus Redis), sends the same requests to each, and
prints what came back: `python scripts/contract_table.py` (from the repository root, in the dev venv).
"""

from __future__ import annotations

from pathlib import Path

import httpx

from twinserve.examples.io import populate
from twinserve.lab.servers import RedisServer, TwinserveServer
from twinserve.servers import SERVERS

ARCHS = tuple(SERVERS)
#: The contract suite's models (tests/conftest.py CONTRACT_MODELS), named by file: nothing imports the tests.
TEST_MODELS = Path(__file__).resolve().parent.parent / "tests" / "models.py"
CONTRACT_MODELS = (
    "twinserve.examples.tabular:Classifier",
    "twinserve.examples.io:FeatureLookup",
    *(
        f"{TEST_MODELS}:{name}"
        for name in ("Echo", "AsyncEcho", "Mixed", "Faulty", "Mismatch", "Gate", "WhereAmI", "Affine", "Sensors")
    ),
)

IRIS = {"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}
J = {"content-type": "application/json"}
V2_IRIS = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": list(IRIS.values())}]}
V2_WIDE = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 5], "data": [1, 2, 3, 4, 5]}]}

CASES: list[tuple[str, str, str, dict[str, object]]] = [
    ("GET /", "GET", "/", {}),
    ("GET /v2/health/live", "GET", "/v2/health/live", {}),
    ("GET /v2/health/ready", "GET", "/v2/health/ready", {}),
    ("GET /v1/models", "GET", "/v1/models", {}),
    ("GET /v1/models/iris", "GET", "/v1/models/iris", {}),
    ("GET /openapi.json", "GET", "/openapi.json", {}),
    ("GET /docs", "GET", "/docs", {}),
    ("GET /metrics", "GET", "/metrics", {}),
    ("POST /v1/models/iris:predict", "POST", "/v1/models/iris:predict", {"json": {"instances": [IRIS]}}),
    ("malformed JSON", "POST", "/v1/models/iris:predict", {"content": b'{"instances": [', "headers": J}),
    ("schema violation", "POST", "/v1/models/iris:predict", {"json": {"instances": [{"sepal_length": "x"}]}}),
    ("unknown model", "POST", "/v1/models/nope:predict", {"json": {"instances": [1]}}),
    ("unknown route", "GET", "/v1/nothing", {}),
    ("wrong method", "GET", "/v1/models/iris:predict", {}),
    ("body over --max-body-bytes", "POST", "/v1/models/echo:predict", {"json": {"instances": ["x" * 70_000]}}),
    (
        "wrong content type",
        "POST",
        "/v1/models/echo:predict",
        {"content": b"{}", "headers": {"content-type": "text/plain"}},
    ),
    ("model raises", "POST", "/v1/models/faulty:predict", {"json": {"instances": ["boom"]}}),
    ("wrong output count", "POST", "/v1/models/mismatch:predict", {"json": {"instances": [1, 2]}}),
    (":stream on a model that does not stream", "POST", "/v1/models/echo:stream", {"json": {"instances": [1]}}),
    ("GET /v2", "GET", "/v2", {}),
    ("GET /v2/models/iris", "GET", "/v2/models/iris", {}),
    ("GET /v2/models/iris/ready", "GET", "/v2/models/iris/ready", {}),
    ("GET /v2/models/iris/config", "GET", "/v2/models/iris/config", {}),
    ("GET /v2/models/iris/stats", "GET", "/v2/models/iris/stats", {}),
    ("POST /v2/models/iris/infer", "POST", "/v2/models/iris/infer", {"json": V2_IRIS}),
    ("V2 wrong shape", "POST", "/v2/models/iris/infer", {"json": V2_WIDE}),
    ("V2 unknown model", "POST", "/v2/models/nope/infer", {"json": V2_IRIS}),
]


def main() -> None:
    redis = RedisServer()
    populate(redis.url, entities=10)
    flags = ("--workers", "2", "--max-body-bytes", "65536", "--redis-url", redis.url)
    servers = {arch: TwinserveServer(CONTRACT_MODELS, arch, *flags) for arch in ARCHS}
    try:
        for server in servers.values():
            server.start()
        print("| request | " + " | ".join(ARCHS) + " | error code |")
        print("|---|" + "---|" * (len(ARCHS) + 1))
        for label, method, path, kwargs in CASES:
            row, code = [], ""
            for server in servers.values():
                response = httpx.request(method, server.url + path, timeout=30, **kwargs)  # type: ignore[arg-type]
                row.append(str(response.status_code))
                if response.status_code >= 400:
                    body = response.json()
                    error = body["error"]
                    # twinserve's nested body; V1's flat one (`error` the message, `code` beside it); V2's message
                    code = error["code"] if isinstance(error, dict) else body.get("code", "(V2 body: message only)")
            print(f"| {label} | " + " | ".join(row) + f" | {code} |")
    finally:
        for server in servers.values():
            server.stop()
        redis.stop()


if __name__ == "__main__":
    main()
