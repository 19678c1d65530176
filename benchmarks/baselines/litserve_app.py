"""The same model on LitServe with batching on (runs in LitServe's own virtualenv; see benchmarks/peers.py).

python benchmarks/baselines/litserve_app.py PORT     (BASELINE_MODEL picks the model)
"""

from __future__ import annotations

import os
import sys
from typing import Any

import litserve as ls
import numpy as np
from pydantic import BaseModel, TypeAdapter

from twinserve.config import load_config
from twinserve.model import ModelSpec, import_model

TARGET = os.environ.get("BASELINE_MODEL", "twinserve.examples.tabular:Classifier")


class BaselineAPI(ls.LitAPI):  # type: ignore[misc]
    def setup(self, device: str) -> None:
        model = import_model(TARGET)()
        model.config = load_config()
        self.spec = ModelSpec(model)
        if self.spec.load is not None:
            self.spec.load.fn()
        self.adapter: TypeAdapter[Any] = TypeAdapter(self.spec.input_type)

    def decode_request(self, request):  # type: ignore[no-untyped-def]  # unannotated: LitServe passes the JSON
        return self.adapter.validate_python(request["instances"][0])

    def batch(self, inputs: list[Any]) -> list[Any]:
        return list(inputs)

    def predict(self, batch: list[Any]) -> Any:
        return self.spec.predict.fn(batch)

    def unbatch(self, output: Any) -> list[Any]:
        return list(output)

    def encode_response(self, output: Any) -> dict[str, Any]:
        if isinstance(output, BaseModel):
            output = output.model_dump(mode="json")
        elif isinstance(output, np.ndarray):
            output = output.tolist()
        return {"predictions": [output]}


if __name__ == "__main__":
    batch_size = 64 if TARGET.endswith(":Classifier") else 32
    api = BaselineAPI(max_batch_size=batch_size, batch_timeout=0.005)
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1)
    server.run(host="127.0.0.1", port=int(sys.argv[1]), generate_client_file=False, log_level="warning")
