"""Models for the gRPC tests: one that echoes a tensor of every Open Inference Protocol datatype."""

from __future__ import annotations

from typing import Any

import numpy as np

import twinserve
from twinserve import Tensor

#: Every datatype the protocol names, with numpy's type for it.
DATATYPES = {
    "BOOL": np.bool_,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
}


#: The datatypes gRPC's typed contents can carry (FP16 has no field: it travels raw only).
TYPED = {name: t for name, t in DATATYPES.items() if name != "FP16"}


class EveryType(twinserve.Model):
    """Each row of `in_<DATATYPE>` comes back as the same row of `out_<DATATYPE>`, for every datatype."""

    types = DATATYPES
    inputs = tuple(Tensor(f"in_{name}", name, [-1, 2]) for name in DATATYPES)
    outputs = tuple(Tensor(f"out_{name}", name, [-1, 2]) for name in DATATYPES)

    def from_tensors(self, arrays: dict[str, np.ndarray[Any, Any]]) -> list[dict[str, Any]]:
        rows = len(next(iter(arrays.values())))
        return [{name: arrays[f"in_{name}"][i] for name in self.types} for i in range(rows)]

    def predict(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return batch

    def to_tensors(self, outputs: list[dict[str, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        return {f"out_{name}": np.stack([o[name] for o in outputs]).astype(t) for name, t in self.types.items()}


class EveryTypedType(EveryType):
    """`EveryType` for the datatypes typed contents can carry."""

    types = TYPED
    inputs = tuple(Tensor(f"in_{name}", name, [-1, 2]) for name in TYPED)
    outputs = tuple(Tensor(f"out_{name}", name, [-1, 2]) for name in TYPED)
