"""The codecs of one served model, one per protocol, built by the layer that speaks the protocols.

The core runs a model on instances and knows no protocol; the fronts decode each request's body into instances
and encode the outputs with these, chosen by the endpoint (`service/exchange.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from twinserve.config import Config
from twinserve.model import ModelSpec
from twinserve.protocol.v1 import V1Codec
from twinserve.protocol.v2 import V2Codec

__all__ = ["ModelCodecs"]


@dataclass(frozen=True, slots=True)
class ModelCodecs:
    """V1 (`{"instances": [...]}`, also the WebSocket text messages and SSE steps) and V2 (tensors)."""

    v1: V1Codec
    v2: V2Codec

    @classmethod
    def of(cls, spec: ModelSpec, config: Config) -> ModelCodecs:
        return cls(
            V1Codec(spec.name, spec.input_type, spec.output_type, config.max_instances),
            V2Codec(spec, config.max_instances, config.max_tensor_elements),
        )
