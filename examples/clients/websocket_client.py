"""Stream predictions over one WebSocket with the plain `websockets` library.

    twinserve serve --arch async            # serves the iris example on 127.0.0.1:8000
    python examples/clients/websocket_client.py --messages 200 --window 16

Text messages carry `{"id", "instances"}` and come back as `{"id", "predictions"}` (or `{"id", "error"}`) as soon
as each is ready, in any order; at most `--window` are unanswered at once (the server refuses more than its
`--ws-max-pending` with a `too_many_pending` error). One binary message at the end sends the same flowers as a V2
FP32 tensor: a 4-byte big-endian header length, the JSON header, then the raw tensor bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import time
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

FLOWERS = [
    {"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2},
    {"sepal_length": 6.4, "sepal_width": 3.2, "petal_length": 4.5, "petal_width": 1.5},
    {"sepal_length": 6.3, "sepal_width": 3.3, "petal_length": 6.0, "petal_width": 2.5},
]


async def stream_text(websocket: ClientConnection, messages: int, window: int) -> dict[str, Any]:
    """Send `messages` predict messages, at most `window` unanswered; return the answers by id."""
    answers: dict[str, Any] = {}
    sent = 0
    while len(answers) < messages:
        while sent < messages and sent - len(answers) < window:
            flower = FLOWERS[sent % len(FLOWERS)]
            await websocket.send(json.dumps({"id": f"m{sent}", "instances": [flower]}))
            sent += 1
        answer = json.loads(await websocket.recv())
        answers[answer["id"]] = answer.get("predictions", answer.get("error"))
    return answers


async def infer_binary(websocket: ClientConnection) -> dict[str, Any]:
    """One V2 message with a binary FP32 tensor of every flower; the JSON header of the answer."""
    tensor = struct.pack(f"<{4 * len(FLOWERS)}f", *(v for flower in FLOWERS for v in flower.values()))
    header = json.dumps(
        {
            "id": "tensor-1",
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": [len(FLOWERS), 4],
                    "parameters": {"binary_data_size": len(tensor)},
                }
            ],
        }
    ).encode()
    await websocket.send(struct.pack(">I", len(header)) + header + tensor)
    reply = await websocket.recv()
    assert isinstance(reply, bytes)
    (length,) = struct.unpack(">I", reply[:4])
    answer: dict[str, Any] = json.loads(reply[4 : 4 + length])  # outputs came back as JSON data: no bytes follow
    return answer


async def main(url: str, messages: int, window: int) -> None:
    async with connect(url) as websocket:
        started = time.perf_counter()
        answers = await stream_text(websocket, messages, window)
        seconds = time.perf_counter() - started
        print(f"{messages} messages answered in {seconds:.3f} s ({messages / seconds:.0f}/s over one socket)")
        print("m0 ->", answers["m0"])
        print("tensor ->", await infer_binary(websocket))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="ws://127.0.0.1:8000/v1/models/iris/ws")
    parser.add_argument("--messages", type=int, default=100)
    parser.add_argument("--window", type=int, default=16)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.url, arguments.messages, arguments.window))
