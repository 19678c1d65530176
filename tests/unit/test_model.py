from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.models import AsyncEcho, Echo, Mixed, Point
from twinserve.errors import ModelImportError, OutputMismatch
from twinserve.examples.tabular import Classifier, IrisFeatures, IrisPrediction
from twinserve.model import ModelSpec, import_model


def test_spec_reads_names_types_and_hooks() -> None:
    spec = ModelSpec(Classifier())
    assert spec.name == "iris"
    assert spec.input_type is IrisFeatures
    assert spec.output_type is IrisPrediction
    assert not spec.predict.is_async
    assert spec.preprocess is None
    assert len(spec.examples()) == 3


def test_spec_defaults_and_async_hooks() -> None:
    echo = ModelSpec(Echo())
    assert echo.name == "echo"
    assert echo.input_type is Any
    async_echo = ModelSpec(AsyncEcho())
    assert async_echo.name == "async-echo"
    assert async_echo.predict.is_async and async_echo.apredict.is_async
    assert async_echo.load is not None and async_echo.load.is_async
    mixed = ModelSpec(Mixed())
    assert mixed.input_type is Point  # the preprocess parameter, not predict's
    assert mixed.apreprocess is mixed.preprocess


def test_import_model_forms() -> None:
    assert import_model("twinserve.examples.tabular:Classifier") is Classifier
    assert import_model("tests/models.py:Echo").__name__ == "Echo"


def test_spec_requires_predict() -> None:
    class NoPredict:
        pass

    with pytest.raises(ModelImportError, match="has no predict"):
        ModelSpec(NoPredict())


def test_spec_of_streaming_models(tmp_path: Path) -> None:
    from tests.models import AsyncDrip, Drip, DripControl
    from twinserve.core.bridge import run_coroutine
    from twinserve.examples.tokens import Prompt, Tokens

    tokens = ModelSpec(Tokens())
    assert tokens.streams and tokens.stream is not None and not tokens.stream.is_async
    assert tokens.input_type is Prompt
    assert tokens.chunk_type is str and tokens.output_type == list[str]
    # Called as a plain predict, a stream gives each instance the list of its chunks.
    outputs = tokens.predict.fn([Prompt(text="a", max_tokens=3), Prompt(text="b", max_tokens=1)])
    assert [len(o) for o in outputs] == [3, 1 + 2] and outputs[1][1:] == ["", ""]
    drip = ModelSpec(AsyncDrip())
    assert drip.streams and drip.stream is not None and drip.stream.is_async
    assert drip.predict.is_async and drip.input_type is DripControl
    assert not ModelSpec(Echo()).streams and ModelSpec(Echo()).stream is None
    assert ModelSpec(Drip()).stream is not None
    collected = run_coroutine(drip.apredict.fn([DripControl(dir=str(tmp_path), tag="x", steps=2)]))
    assert collected == [["x-0", "x-1"]]


def test_streaming_predict_and_apredict_must_agree() -> None:
    class Half:
        def predict(self, batch: list[int]) -> Iterator[list[int]]:
            yield batch

        async def apredict(self, batch: list[int]) -> list[int]:
            return batch

    with pytest.raises(ModelImportError, match="both be generators"):
        ModelSpec(Half())


def test_a_streamed_step_must_hold_one_chunk_per_instance() -> None:
    class Short:
        def predict(self, batch: list[int]) -> Iterator[list[int]]:
            yield batch[1:]

    with pytest.raises(OutputMismatch, match="yielded 1 chunks for 2 inputs"):
        ModelSpec(Short()).predict.fn([1, 2])
