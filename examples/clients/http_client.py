"""Call a twinserve model over plain HTTP with httpx: V1 `:predict` and the Open Inference Protocol's V2 `/infer`.

    twinserve serve --arch async            # serves the iris example on 127.0.0.1:8000
    python examples/clients/http_client.py --url http://127.0.0.1:8000 --model iris

Prints the model's metadata, then the predictions for the model's own example instances through V1 and V2. Pass
`--api-key` when the server was started with `--api-key`; errors print the server's JSON error body and exit 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import httpx


def metadata(client: httpx.Client, model: str) -> dict[str, Any]:
    """`GET /v1/models/{model}`: schemas, example instances and serving settings."""
    return _json(client.get(f"/v1/models/{model}"))


def predict(client: httpx.Client, model: str, instances: list[Any]) -> list[Any]:
    """V1: `{"instances": [...]}` in, `{"predictions": [...]}` out, one prediction per instance."""
    return _json(client.post(f"/v1/models/{model}:predict", json={"instances": instances}))["predictions"]  # type: ignore[no-any-return]


def infer(client: httpx.Client, model: str, inputs: list[dict[str, Any]]) -> dict[str, Any]:
    """V2: named, typed tensors in and out (`{"inputs": [{"name", "datatype", "shape", "data"}]}`)."""
    return _json(client.post(f"/v2/models/{model}/infer", json={"id": "example", "inputs": inputs}))


def _json(response: httpx.Response) -> dict[str, Any]:
    if response.is_error:
        raise SystemExit(f"HTTP {response.status_code} from {response.request.url}: {response.text}")
    return response.json()  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="iris")
    parser.add_argument("--api-key", help="sent as `Authorization: Bearer KEY`")
    args = parser.parse_args(argv)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    with httpx.Client(base_url=args.url, headers=headers, timeout=30) as client:
        meta = metadata(client, args.model)
        examples = meta["examples"]
        if not examples:
            print(f"model {args.model!r} has no examples(): nothing to send", file=sys.stderr)
            return 1
        print(f"model {meta['name']} version {meta['version']}, {len(examples)} example instances")
        for instance, prediction in zip(examples, predict(client, args.model, examples), strict=True):
            print(f"V1 {json.dumps(instance)} -> {json.dumps(prediction)}")
        # The V2 view of the same model: its tensors, and the same examples as tensors (from the server's OpenAPI
        # document, which carries a ready-made V2 request for each model).
        v2 = _json(client.get(f"/v2/models/{args.model}"))
        print("V2 inputs:", ", ".join(f"{t['name']} {t['datatype']}{t['shape']}" for t in v2["inputs"]))
        document = _json(client.get("/openapi.json"))
        body = document["paths"][f"/v2/models/{args.model}/infer"]["post"]["requestBody"]
        request = body["content"]["application/json"]["example"]
        for output in infer(client, args.model, request["inputs"])["outputs"]:
            print(f"V2 {output['name']} {output['datatype']}{output['shape']}: {json.dumps(output['data'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
