"""Hybrid's pipe to its model workers carries frames longer than one socket read or write.

Under uvicorn the event loop is uvloop, and libuv leaves a pipe it polls non-blocking: a reply longer than the
socket's buffer was then half-read, and a batch longer than it half-sent (BlockingIOError), each taken for the
worker's death (503 `worker_died`, and a replacement loading for seconds). MiniLM's batch of 32 embeddings, 49 KB,
died so on every other batch under load.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from tests.serving import Server, model_path, predict

BIG = 3 * 1024 * 1024  # far past a socketpair's buffer (~200 KB here)


def test_replies_and_batches_longer_than_the_pipe_buffer_cross_whole() -> None:
    with Server([model_path("Inflate")], "hybrid", "--model-workers", "1", "--max-batch-size", "4") as server:
        for _ in range(3):  # a small batch goes from the loop, which watches the pipe: its large reply
            response = predict(server, "inflate", [BIG], timeout=60)
            assert response.status_code == 200, response.text[:300]
            assert response.json()["predictions"][0] == "x" * BIG
        large = "y" * BIG  # a large batch goes from a thread, on the pipe the loop watched for those replies
        response = predict(server, "inflate", [large], timeout=60)
        assert response.status_code == 200, response.text[:300]
        assert response.json() == {"predictions": [large]}
        with ThreadPoolExecutor(4) as pool:  # several at once: batches of them
            answers = list(pool.map(lambda i: predict(server, "inflate", [BIG + i], timeout=60), range(8)))
        assert [len(a.json()["predictions"][0]) for a in answers] == [BIG + i for i in range(8)]
