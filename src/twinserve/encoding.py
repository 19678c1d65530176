"""JSON for what models take and return: numpy arrays and scalars, pydantic models and sets, as JSON values.

Below the core and the protocols alike: the cache keys instances with it, the codecs answer with it.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson
from pydantic import BaseModel

__all__ = ["dumps", "json_default"]


def json_default(obj: Any) -> Any:
    """orjson's `default`: the JSON value of a pydantic model, a numpy scalar or array, or a set.

    orjson writes a C-contiguous array of its dtypes itself; a strided view (`proba[:, 0]`) comes here and is made
    contiguous (orjson then writes it), and an array of any other dtype becomes lists."""
    if isinstance(obj, np.ndarray):
        return obj.tolist() if obj.flags.c_contiguous else np.ascontiguousarray(obj)
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, set | frozenset):
        return list(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def dumps(payload: Any) -> bytes:
    """JSON bytes for anything a model may return: numpy arrays and scalars, pydantic models, sets."""
    try:
        return orjson.dumps(payload, default=json_default, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError as exc:
        if "64-bit" not in str(exc):
            raise
    # JSON numbers have no size limit and the request parser takes any integer, so an echo of 2**70 is valid:
    # only orjson stops at 64 bits. The standard library writes it (rarely needed, so its speed does not matter).
    try:
        return json.dumps(payload, default=_any_default, separators=(",", ":"), allow_nan=False).encode()
    except ValueError as exc:  # NaN or infinity beside the big integer: no JSON for it
        raise TypeError(str(exc)) from None


def _any_default(obj: Any) -> Any:
    return obj.tolist() if isinstance(obj, np.ndarray) else json_default(obj)
