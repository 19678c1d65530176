"""The V2 codec without a server: derivation of tensors, decoding, encoding, binary data (as tritonclient makes it)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import numpy as np
import orjson
import pytest
import tritonclient.http as triton
from pydantic import BaseModel, Field

from tests.models import Affine, Chatty, Echo, Faulty, Mismatch, Mixed, Sensors
from twinserve import Tensor
from twinserve.errors import (
    InvalidTensor,
    MalformedRequest,
    ModelImportError,
    OutputMismatch,
    TwinserveError,
    ValidationFailed,
)
from twinserve.examples.embed import MiniLM
from twinserve.examples.tabular import Classifier, IrisFeatures
from twinserve.model import ModelSpec
from twinserve.observability.metrics import InferenceTotals
from twinserve.protocol.tensors import array_from_json
from twinserve.protocol.v2 import V2Codec, error_body, statistics

SETOSA = [5.1, 3.5, 1.4, 0.2]
VIRGINICA = [6.3, 3.3, 6.0, 2.5]


def codec(model: object) -> V2Codec:
    return V2Codec(ModelSpec(model))


def tensors(c: V2Codec) -> tuple[list[tuple[str, str, list[int]]], list[tuple[str, str, list[int]]]]:
    meta = c.metadata()
    return (
        [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]],
        [(t["name"], t["datatype"], t["shape"]) for t in meta["outputs"]],
    )


def request(*inputs: dict[str, Any], **extra: Any) -> bytes:
    return orjson.dumps({"inputs": list(inputs), **extra})


def iris_input(rows: list[list[Any]], **overrides: Any) -> dict[str, Any]:
    return {"name": "input", "datatype": "FP32", "shape": [len(rows), 4], "data": rows, **overrides}


# -- which tensors a model has -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("model", "inputs", "outputs"),
    [
        (
            Classifier(),
            [("input", "FP32", [-1, 4])],
            [("label", "BYTES", [-1]), ("class_id", "INT64", [-1]), ("probabilities", "FP32", [-1, 3])],
        ),
        (MiniLM(), [("text", "BYTES", [-1])], [("embedding", "FP32", [-1, 384])]),
        (Mixed(), [("input", "INT64", [-1, 2])], [("output", "INT64", [-1])]),  # preprocess takes a Point(x, y)
        (Faulty(), [("input", "BYTES", [-1])], [("output", "BYTES", [-1])]),
        (Chatty(), [("input", "FP32", [-1])], [("output", "FP32", [-1])]),
        (Mismatch(), [("input", "INT64", [-1])], [("output", "INT64", [-1])]),
        (Echo(), [("input", "BYTES", [-1])], [("output", "BYTES", [-1])]),  # any JSON: JSON text
        (
            Sensors(),
            [("input", "BYTES", [-1])],
            [
                ("sensor", "BYTES", [-1]),
                ("count", "INT64", [-1]),
                ("mean", "FP32", [-1]),
                ("ok", "BOOL", [-1]),
                ("extremes", "FP32", [-1, -1]),
                ("notes", "BYTES", [-1]),
            ],
        ),
        (
            Affine(),
            [("x", "FP64", [-1, 2]), ("scale", "FP64", [-1])],
            [("y", "FP64", [-1, 2]), ("total", "FP64", [-1])],
        ),
    ],
)
def test_tensors_are_declared_or_derived(
    model: object, inputs: list[tuple[str, str, list[int]]], outputs: list[tuple[str, str, list[int]]]
) -> None:
    assert tensors(codec(model)) == (inputs, outputs)


class Grid(BaseModel):
    cells: Annotated[list[list[int]], Field(min_length=2, max_length=2)]
    tag: Literal["a", "b"]


class Triples:
    def predict(self, batch: list[Annotated[list[str], Field(min_length=3, max_length=3)]]) -> list[Grid]:
        return []


def test_derivation_of_lists_literals_and_fixed_lengths() -> None:
    assert tensors(codec(Triples())) == (
        [("input", "BYTES", [-1, 3])],
        [("cells", "INT64", [-1, 2, -1]), ("tag", "BYTES", [-1])],
    )


def test_declarations_are_checked_at_import() -> None:
    with pytest.raises(ModelImportError, match="datatype must be one of"):
        Tensor("x", "FLOAT")
    with pytest.raises(ModelImportError, match="must start with the batch dimension -1"):
        Tensor("x", "FP32", [4])

    class Twice(Echo):
        inputs = (Tensor("x", "FP32"), Tensor("x", "FP32"))

    with pytest.raises(ModelImportError, match="names a tensor twice"):
        ModelSpec(Twice())

    class AsyncHook(Echo):
        async def from_tensors(self, arrays: Any) -> list[Any]:  # type: ignore[override]  # the mistake under test
            return []

    with pytest.raises(ModelImportError, match="must be a plain def"):
        ModelSpec(AsyncHook())


def test_metadata_and_triton_config() -> None:
    iris = codec(Classifier())
    assert iris.metadata()["name"] == "iris" and iris.metadata()["versions"] == ["1"]
    config = iris.config(max_batch_size=32, max_delay_ms=2.5)
    assert config["max_batch_size"] == 32
    assert config["dynamic_batching"] == {"max_queue_delay_microseconds": 2500}
    assert config["input"] == [{"name": "input", "data_type": "TYPE_FP32", "dims": [4]}]
    assert config["output"][0] == {"name": "label", "data_type": "TYPE_STRING", "dims": [1], "reshape": {"shape": []}}
    assert config["output"][2] == {"name": "probabilities", "data_type": "TYPE_FP32", "dims": [3]}
    assert "dynamic_batching" not in iris.config(max_batch_size=1, max_delay_ms=0)


# -- decoding ----------------------------------------------------------------------------------------------------
def test_iris_rows_become_instances_nested_or_flat() -> None:
    iris = codec(Classifier())
    nested = iris.decode(request(iris_input([SETOSA, VIRGINICA])))
    flat = iris.decode(request(iris_input([SETOSA, VIRGINICA], data=SETOSA + VIRGINICA)))
    assert nested.instances == flat.instances
    assert [type(i) for i in nested.instances] == [IrisFeatures, IrisFeatures]
    assert nested.instances[1].petal_length == pytest.approx(6.0)
    assert nested.instances[0].sepal_length == pytest.approx(5.1, rel=1e-6)  # FP32, as declared
    assert nested.id is None and [o.tensor.name for o in nested.outputs] == ["label", "class_id", "probabilities"]
    timed = iris.decode(request(iris_input([SETOSA]), id="t", parameters={"timeout": 5000, "priority": 1}))
    assert (timed.id, timed.timeout_us) == ("t", 5000)


def test_ints_fill_float_tensors_and_strings_fill_bytes() -> None:
    assert codec(Classifier()).decode(request(iris_input([[5, 3, 1, 1]]))).instances[0].sepal_length == 5.0

    def strings(*data: str) -> bytes:
        return request({"name": "input", "datatype": "BYTES", "shape": [len(data)], "data": list(data)})

    assert codec(Faulty()).decode(strings("a", "é")).instances == ["a", "é"]
    assert codec(Echo()).decode(strings('{"k": 1}', "2")).instances == [{"k": 1}, 2]
    mixed = codec(Mixed()).decode(request({"name": "input", "datatype": "INT64", "shape": [1, 2], "data": [3, 4]}))
    assert (mixed.instances[0].x, mixed.instances[0].y) == (3, 4)


@pytest.mark.parametrize(
    ("body", "error", "message"),
    [
        (b"{", MalformedRequest, "request body is not valid JSON"),
        (b"[1]", InvalidTensor, "the request must be a JSON object"),
        (b'{"inputs": []}', InvalidTensor, "non-empty 'inputs' list"),
        (request(iris_input([SETOSA], name="x")), InvalidTensor, "unknown input 'x': model 'iris' takes 'input'"),
        (request(iris_input([SETOSA], datatype="FP64")), InvalidTensor, "has datatype 'FP64'; the model takes FP32"),
        (request(iris_input([SETOSA], shape=[1, 5])), InvalidTensor, "has shape [1, 5]; the model takes [-1, 4]"),
        (request(iris_input([SETOSA], shape=[4])), InvalidTensor, "has shape [4]; the model takes [-1, 4]"),
        (request(iris_input([SETOSA], shape=[1, -4])), InvalidTensor, "shape must be a list of non-negative"),
        (request(iris_input([SETOSA], shape=[2, 4])), InvalidTensor, "4 data elements do not fill shape [2, 4]"),
        (request(iris_input([[1, 2], [3]], shape=[1, 4])), InvalidTensor, "not a rectangular array"),
        (request(iris_input([["a", "b", "c", "d"]])), InvalidTensor, "FP32 data must be numbers, got strings"),
        (request(iris_input([], shape=[0, 4])), InvalidTensor, "at least one instance"),
        (request(iris_input([SETOSA]), iris_input([SETOSA])), InvalidTensor, "input 'input' is given twice"),
        (request(iris_input([[1, None, 2, 3]])), InvalidTensor, "FP32 data must be numbers, got mixed values"),
        (request(iris_input([SETOSA], data=5.1)), InvalidTensor, "data must be a list, got float"),
        (request(iris_input([SETOSA], data=None)), InvalidTensor, "has neither 'data' nor binary data"),
        (request(iris_input([SETOSA]), id=7), InvalidTensor, "the request id must be a string"),
        (request(iris_input([SETOSA]), outputs=[{"name": "nope"}]), InvalidTensor, "unknown output 'nope'"),
        (
            request(iris_input([SETOSA]), outputs=[{"name": "label", "parameters": {"classification": 2}}]),
            InvalidTensor,
            "parameter 'classification' is not supported",
        ),
        (request(iris_input([SETOSA]), parameters={"timeout": -1}), InvalidTensor, "'timeout' must be a positive"),
    ],
)
def test_decode_errors(body: bytes, error: type[TwinserveError], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        codec(Classifier()).decode(body)


def test_int_ranges_and_kinds_are_checked() -> None:
    with pytest.raises(InvalidTensor, match="out of the range of UINT8"):
        array_from_json("x", "UINT8", [2], [1, 256])
    with pytest.raises(InvalidTensor, match="INT32 data must be integers, got numbers"):
        array_from_json("x", "INT32", [1], [1.5])
    with pytest.raises(InvalidTensor, match="BOOL data must be booleans"):
        array_from_json("x", "BOOL", [1], [1])
    assert array_from_json("x", "UINT64", [1], [2**64 - 1]).dtype == np.uint64
    assert array_from_json("x", "FP16", [2, 1], [[1], [0.5]]).dtype == np.float16
    missing = codec(Affine())
    with pytest.raises(InvalidTensor, match="missing input 'scale'"):
        missing.decode(request({"name": "x", "datatype": "FP64", "shape": [1, 2], "data": [1, 2]}))
    with pytest.raises(InvalidTensor, match="disagree on the batch dimension"):
        missing.decode(
            request(
                {"name": "x", "datatype": "FP64", "shape": [1, 2], "data": [1, 2]},
                {"name": "scale", "datatype": "FP64", "shape": [2], "data": [1, 2]},
            )
        )


def test_rows_failing_the_model_schema_are_422_naming_the_row() -> None:
    bad = [*SETOSA[:3], -1.0]
    with pytest.raises(ValidationFailed, match=re.escape("rows[1].petal_width: Input should be greater than 0")):
        codec(Classifier()).decode(request(iris_input([SETOSA, bad])))
    with pytest.raises(ValidationFailed, match=re.escape("rows[0]: String should have at least 1 character")):
        codec(MiniLM()).decode(request({"name": "text", "datatype": "BYTES", "shape": [1], "data": [""]}))
    with pytest.raises(InvalidTensor, match=re.escape("input 'input'[1] is not JSON text")):
        codec(Echo()).decode(request({"name": "input", "datatype": "BYTES", "shape": [2], "data": ["1", "{"]}))


# -- binary tensor data, exactly as tritonclient sends and reads it ------------------------------------------------
def _triton_body(inputs: list[triton.InferInput], **kwargs: Any) -> tuple[bytes, str | None]:
    body, json_size = triton.InferenceServerClient.generate_request_body(inputs, **kwargs)
    return body, None if json_size is None else str(json_size)


def test_binary_inputs_and_outputs_round_trip_with_tritonclient() -> None:
    affine = codec(Affine())
    x = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    scale = np.array([2.0, 0.5, -1.0])
    inputs = [triton.InferInput("x", [3, 2], "FP64"), triton.InferInput("scale", [3], "FP64")]
    inputs[0].set_data_from_numpy(x)  # binary_data=True is tritonclient's default
    inputs[1].set_data_from_numpy(scale, binary_data=False)
    outputs = [triton.InferRequestedOutput("total"), triton.InferRequestedOutput("y", binary_data=False)]
    body, header_length = _triton_body(inputs, outputs=outputs, request_id="req-1")
    assert header_length is not None
    decoded = affine.decode(body, header_length)
    assert decoded.instances[1] == {"x": [3.0, 4.0], "scale": 0.5}
    response, response_header = affine.encode(decoded, Affine().predict(decoded.instances))
    result = triton.InferenceServerClient.parse_response_body(response, header_length=response_header)
    assert result.get_response()["id"] == "req-1"
    assert [o["name"] for o in result.get_response()["outputs"]] == ["total", "y"]
    np.testing.assert_allclose(result.as_numpy("y"), x * scale[:, None])
    np.testing.assert_allclose(result.as_numpy("total"), (x * scale[:, None]).sum(axis=1))


def test_binary_bytes_tensors_and_binary_data_output() -> None:
    faulty = codec(Faulty())
    words = np.array(["héllo", "", "wörld"], dtype=object)
    text = triton.InferInput("input", [3], "BYTES")
    text.set_data_from_numpy(words)
    body, header_length = _triton_body([text])  # no outputs named: all, binary (binary_data_output)
    decoded = faulty.decode(body, header_length)
    assert decoded.instances == ["héllo", "", "wörld"]
    response, response_header = faulty.encode(decoded, [w.upper() for w in decoded.instances])
    assert response_header is not None
    result = triton.InferenceServerClient.parse_response_body(response, header_length=response_header)
    assert result.as_numpy("output").tolist() == ["HÉLLO".encode(), b"", "WÖRLD".encode()]


@pytest.mark.parametrize(
    ("header_length", "tail", "message"),
    [
        ("x", 16, "must be between 0 and the body length"),
        ("100000", 16, "must be between 0 and the body length"),
        (None, 16, "not valid JSON"),
        ("json", 7, "binary_data_size 16 overruns the binary data"),
        ("json", 24, "8 bytes of binary data belong to no input"),
    ],
)
def test_binary_framing_errors(header_length: str | None, tail: int, message: str) -> None:
    header = request(iris_input([SETOSA], data=None, parameters={"binary_data_size": 16}))
    length = str(len(header)) if header_length == "json" else header_length
    with pytest.raises((InvalidTensor, MalformedRequest), match=re.escape(message)):
        codec(Classifier()).decode(header + b"\0" * tail, length)


# -- encoding ----------------------------------------------------------------------------------------------------
def test_iris_outputs_are_flat_row_major_and_selectable() -> None:
    iris = codec(Classifier())
    model = Classifier()
    model.load()
    decoded = iris.decode(request(iris_input([SETOSA, VIRGINICA]), id="abc"))
    body, header_length = iris.encode(decoded, model.predict(decoded.instances))
    assert header_length is None
    response = orjson.loads(body)
    assert response["model_name"] == "iris" and response["model_version"] == "1" and response["id"] == "abc"
    by_name = {o["name"]: o for o in response["outputs"]}
    assert by_name["label"] == {"name": "label", "datatype": "BYTES", "shape": [2], "data": ["setosa", "virginica"]}
    assert by_name["class_id"]["data"] == [0, 2]
    probabilities = by_name["probabilities"]
    assert probabilities["datatype"] == "FP32" and probabilities["shape"] == [2, 3] and len(probabilities["data"]) == 6
    chosen = iris.decode(request(iris_input([SETOSA]), outputs=[{"name": "class_id"}]))
    only = orjson.loads(iris.encode(chosen, model.predict(chosen.instances))[0])
    assert [o["name"] for o in only["outputs"]] == ["class_id"]


def test_fields_that_fit_no_tensor_are_json_text() -> None:
    sensors = codec(Sensors())
    decoded = sensors.decode(
        request({"name": "input", "datatype": "BYTES", "shape": [1], "data": ['{"sensor": "a", "values": [1, 3]}']})
    )
    response = orjson.loads(sensors.encode(decoded, Sensors().predict(decoded.instances))[0])
    by_name = {o["name"]: o["data"] for o in response["outputs"]}
    assert by_name == {
        "sensor": ["a"],
        "count": [2],
        "mean": [2.0],
        "ok": [True],
        "extremes": [1.0, 3.0],
        "notes": ['{"first":1.0}'],
    }


def test_output_problems_are_500() -> None:
    iris = codec(Classifier())
    decoded = iris.decode(request(iris_input([SETOSA, VIRGINICA])))
    with pytest.raises(OutputMismatch, match="predict returned 1 outputs for 2 inputs"):
        iris.encode(decoded, [{}])
    with pytest.raises(OutputMismatch, match="must return a list, got dict"):
        iris.encode(decoded, {})
    with pytest.raises(OutputMismatch, match="has no field 'label'"):
        iris.encode(decoded, [{}, {}])
    bad = [{"label": "setosa", "class_id": 0, "probabilities": [1.0, 0.0]}] * 2
    with pytest.raises(OutputMismatch, match=re.escape("output 'probabilities' has shape [2, 2]; the model declares")):
        iris.encode(decoded, bad)
    minilm = codec(MiniLM())
    text = minilm.decode(request({"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi"]}))
    with pytest.raises(OutputMismatch, match="output 'embedding' has shape"):
        minilm.encode(text, np.zeros((1, 3), dtype=np.float32))


def test_request_id_defaults_to_the_current_request() -> None:
    echo = codec(Echo())
    decoded = echo.decode(request({"name": "input", "datatype": "BYTES", "shape": [1], "data": ["[1, 2]"]}))
    response = orjson.loads(echo.encode(decoded, [[1, 2]])[0])
    assert response["id"] == "" and response["outputs"][0]["data"] == ["[1,2]"]


def test_error_body_and_statistics() -> None:
    assert orjson.loads(error_body(InvalidTensor("bad shape"))) == {"error": "bad shape"}
    totals = InferenceTotals(
        requests=5, succeeded=4, seconds=0.5, failed_seconds=0.1, computed=4, queue_seconds=0.02, compute_seconds=0.2
    )
    totals.batches, totals.instances = 2, 9
    stats = statistics("iris", "1", totals)
    assert stats["inference_count"] == 9 and stats["execution_count"] == 2
    inference = stats["inference_stats"]
    assert inference["success"] == {"count": 4, "ns": 400_000_000}
    assert inference["fail"] == {"count": 1, "ns": 100_000_000}
    assert inference["queue"] == {"count": 4, "ns": 20_000_000}
    assert inference["compute_infer"] == {"count": 4, "ns": 200_000_000}
    # perf_analyzer aborts unless the three compute counts agree; input and output are not timed apart
    assert inference["compute_input"] == inference["compute_output"] == {"count": 4, "ns": 0}


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64", "INT8", "INT64", "UINT8", "UINT64"])
@pytest.mark.parametrize(
    ("data", "got"),
    [([1, True], "booleans"), ([[1], [False]], "booleans"), ([True, False], "booleans"), ([1, "1.5"], "strings")],
)
def test_numeric_data_takes_json_numbers_only(datatype: str, data: list[Any], got: str) -> None:
    """The Open Inference Protocol's "data must match the datatype": numpy alone reads `[1, true]` as `[1, 1]`."""
    shape = [2, 1] if isinstance(data[0], list) else [2]
    expected = "numbers" if datatype.startswith("FP") else "integers"
    with pytest.raises(InvalidTensor, match=re.escape(f"{datatype} data must be {expected}, got {got}")):
        array_from_json("x", datatype, shape, data)


def test_a_body_without_true_or_false_is_not_searched_for_one() -> None:
    # The search costs a pass over the data: the codec skips it when the JSON holds no `true` or `false` at all.
    assert array_from_json("x", "FP32", [2], [1, True], booleans=False).tolist() == [1.0, 1.0]
    assert array_from_json("x", "BOOL", [2], [True, False]).tolist() == [True, False]
    body = request({"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [5.1, True, 1.4, 0.2]})
    with pytest.raises(InvalidTensor, match="FP32 data must be numbers, got booleans"):
        codec(Classifier()).decode(body)
