"""Read a twinserve stream (`POST /v1/models/{model}:stream`) with plain httpx and print each step as it comes.

    twinserve serve twinserve.examples.tokens:Tokens --arch async
    python examples/clients/sse_client.py --url http://127.0.0.1:8000 --model tokens \
        '{"text": "Why stream?", "max_tokens": 12}'

Prints the chunks as they arrive (one column per instance); exits 1 if the server reports an error (before the
first step as an HTTP error status, after it as an `event: error`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import Any

import httpx


def events(response: httpx.Response) -> Iterator[tuple[str, Any]]:
    """Server-Sent Events from a streamed response: (event name, parsed JSON data); "message" when unnamed."""
    name, data = "message", []
    for line in response.iter_lines():
        if not line:  # a blank line ends an event
            if data:
                yield name, json.loads("\n".join(data))
            name, data = "message", []
        elif line.startswith("event:"):
            name = line[len("event:") :].strip()
        elif line.startswith("data:"):
            data.append(line[len("data:") :].strip())
    if data:
        yield name, json.loads("\n".join(data))


def stream(url: str, model: str, instances: list[Any], timeout: float = 60.0) -> Iterator[tuple[str, Any]]:
    """POST the instances to `:stream` and yield its events; raise `httpx.HTTPStatusError` on an error status."""
    with httpx.stream("POST", f"{url}/v1/models/{model}:stream", json={"instances": instances}, timeout=timeout) as r:
        if r.status_code != 200:
            r.read()
            r.raise_for_status()
        yield from events(r)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("instances", nargs="+", help="one JSON instance per argument")
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="tokens")
    args = parser.parse_args(argv)
    instances = [json.loads(text) for text in args.instances]
    try:
        for name, data in stream(args.url, args.model, instances):
            if name == "error":
                print(f"\nerror: {data['error']['code']}: {data['error']['message']}", file=sys.stderr)
                return 1
            if name == "end":
                print()
                return 0
            chunks = data["predictions"]
            if len(chunks) == 1:  # one instance: its text as it grows
                print(chunks[0], end=" ", flush=True)
            else:  # one column per instance
                print(" | ".join(str(chunk) for chunk in chunks), flush=True)
    except httpx.HTTPStatusError as exc:
        print(f"error: HTTP {exc.response.status_code}: {exc.response.text}", file=sys.stderr)
        return 1
    print("\nerror: the stream ended without an end event", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
