from __future__ import annotations

from typing import Any

import pytest

from tests.models import AsyncEcho, Echo, Mixed, Point
from twinserve.errors import ModelImportError
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
