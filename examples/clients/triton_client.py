"""Call twinserve with NVIDIA's own client, `tritonclient.http` (`pip install tritonclient[http]`).

    twinserve serve --arch hybrid           # serves the iris example on 127.0.0.1:8000
    python examples/clients/triton_client.py --url 127.0.0.1:8000

twinserve speaks the Open Inference Protocol (KServe V2) that Triton serves, so Triton's client works unchanged:
server and model metadata, readiness, and inference with typed tensors (binary tensor data by default; `--json`
sends and receives JSON tensors instead). Exits 1 with the server's message if the server refuses the request.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

FLOWERS = np.array([[5.1, 3.5, 1.4, 0.2], [6.4, 3.2, 4.5, 1.5], [6.3, 3.3, 6.0, 2.5]], dtype=np.float32)


def classify(client: triton.InferenceServerClient, model: str, rows: np.ndarray, binary: bool) -> dict[str, list]:
    """One V2 inference of `rows` (FP32 `[N, 4]`); every output the model declares, as Python lists."""
    tensor = triton.InferInput("input", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows, binary_data=binary)
    declared = client.get_model_metadata(model)["outputs"]
    wanted = [triton.InferRequestedOutput(output["name"], binary_data=binary) for output in declared]
    result = client.infer(model, [tensor], outputs=wanted, request_id="triton-example")
    return {output["name"]: result.as_numpy(output["name"]).tolist() for output in declared}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="127.0.0.1:8000", help="host:port, as tritonclient takes it")
    parser.add_argument("--model", default="iris")
    parser.add_argument("--json", action="store_true", help="JSON tensors instead of Triton's binary extension")
    args = parser.parse_args(argv)
    client = triton.InferenceServerClient(args.url)
    try:
        server = client.get_server_metadata()
        print(f"server {server['name']} {server['version']}, extensions: {', '.join(server['extensions'])}")
        print(f"live {client.is_server_live()}, ready {client.is_server_ready()}, "
              f"model ready {client.is_model_ready(args.model)}")  # fmt: skip
        for name, values in classify(client, args.model, FLOWERS, binary=not args.json).items():
            values = [v.decode() if isinstance(v, bytes) else v for v in values]
            print(f"{name}: {values}")
        stats = client.get_inference_statistics(args.model)["model_stats"][0]["inference_stats"]
        print(f"server-side: {stats['success']['count']} inferences, queue {stats['queue']['ns'] / 1e6:.2f} ms in all")
    except InferenceServerException as exc:
        print(f"error: {exc.message()}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
