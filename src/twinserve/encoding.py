"""JSON for what models take and return: numpy arrays and scalars, pydantic models and sets, as JSON values.

Below the core and the protocols alike: the cache keys instances with it, the codecs answer with it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
from pydantic import BaseModel

__all__ = ["dumps", "json_default"]


def json_default(obj: Any) -> Any:
    """orjson's `default`: the JSON value of a pydantic model, a numpy scalar or a set."""
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, set | frozenset):
        return list(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def dumps(payload: Any) -> bytes:
    """JSON bytes for anything a model may return: numpy arrays and scalars, pydantic models, sets."""
    return orjson.dumps(payload, default=json_default, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
