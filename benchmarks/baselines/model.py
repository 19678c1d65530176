"""The same model every baseline serves: BASELINE_MODEL (an import string), loaded once per process."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from pydantic import TypeAdapter

from twinserve.config import load_config
from twinserve.model import ModelSpec, import_model
from twinserve.protocol.v1 import dumps

__all__ = ["load_predictor"]


def load_predictor() -> Callable[[list[Any]], bytes]:
    """`predict(instances) -> JSON bytes of {"predictions": [...]}`, validating instances like twinserve does."""
    model = import_model(os.environ.get("BASELINE_MODEL", "twinserve.examples.tabular:Classifier"))()
    model.config = load_config()
    spec = ModelSpec(model)
    if spec.load is not None:
        spec.load.fn()
    adapter: TypeAdapter[list[Any]] = TypeAdapter(list[spec.input_type])  # type: ignore[name-defined]

    def predict(instances: list[Any]) -> bytes:
        return dumps({"predictions": spec.predict.fn(adapter.validate_python(instances))})

    return predict
