"""The same model's outputs are encoded the same way in every architecture (issue #55): whatever a `predict` may
return (numpy arrays of every dtype, strided and transposed views, 0-d arrays and numpy scalars, lists and dicts of
them, bytes, pydantic models, torch tensors where torch is installed), sync, async and hybrid answer one instance
and many with the same status and the same body, byte for byte. In process: the apps the servers build
(tests/inprocess.py); the generator is hypothesis's."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.inprocess import Answer, served_per_arch
from tests.serving import model_path

#: Each dtype with values it holds exactly (hypothesis draws from them).
DTYPES: dict[str, st.SearchStrategy[Any]] = {
    "bool": st.booleans(),
    **{f"int{bits}": st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) for bits in (8, 16, 32, 64)},
    **{f"uint{bits}": st.integers(0, 2**bits - 1) for bits in (8, 16, 32, 64)},
    "float16": st.floats(width=16, allow_nan=False, allow_infinity=False),
    "float32": st.floats(width=32, allow_nan=False, allow_infinity=False),
    "float64": st.floats(allow_nan=False, allow_infinity=False),
    "complex64": st.complex_numbers(max_magnitude=1e6, allow_nan=False, allow_infinity=False).map(
        lambda c: [c.real, c.imag]
    ),
    "str": st.text(max_size=5),
}
TORCH = importlib.util.find_spec("torch") is not None
REQUEST_ID = "equal-answers"


def _values(dtype: str, count: int) -> st.SearchStrategy[list[Any]]:
    return st.lists(DTYPES[dtype], min_size=count, max_size=count)


@st.composite
def arrays(draw: st.DrawFn) -> dict[str, Any]:
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    shape = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    values = draw(_values(dtype, int(np.prod(shape))))  # complex64: [real, imag] pairs, built in the model
    view = draw(st.sampled_from(["plain", "transposed", "strided"]))
    return {"kind": "array", "dtype": "U5" if dtype == "str" else dtype, "shape": shape, "values": values, "view": view}


@st.composite
def scalars(draw: st.DrawFn) -> dict[str, Any]:
    dtype = draw(st.sampled_from(sorted(set(DTYPES) - {"complex64", "str"})))
    return {"kind": draw(st.sampled_from(["scalar", "zero-d"])), "dtype": dtype, "value": draw(DTYPES[dtype])}


def _leaves() -> st.SearchStrategy[Any]:
    leaves: list[st.SearchStrategy[Any]] = [
        arrays(),
        scalars(),
        st.text(max_size=8),
        st.integers(-(2**70), 2**70),
        st.builds(lambda v: {"kind": "bytes", "value": v}, st.text(max_size=4)),
        st.builds(lambda x, y: {"kind": "pydantic", "x": x, "y": y}, st.floats(-1e6, 1e6), st.floats(-1e6, 1e6)),
    ]
    if TORCH:
        torch_values = st.lists(st.floats(-1e6, 1e6, width=32), min_size=1, max_size=4)
        leaves.append(st.builds(lambda v: {"kind": "torch", "dtype": "float32", "values": v}, torch_values))
    return st.one_of(leaves)


OUTPUTS = st.recursive(
    _leaves(),
    lambda inner: st.one_of(
        st.builds(lambda items: {"kind": "list", "items": items}, st.lists(inner, max_size=3)),
        st.builds(
            lambda items: {"kind": "dict", "items": items}, st.dictionaries(st.text(max_size=3), inner, max_size=3)
        ),
    ),
    max_leaves=4,
)


@pytest.fixture(scope="module")
def apps() -> Iterator[dict[str, Any]]:
    with served_per_arch([model_path("Returns")], max_batch_delay_ms=0) as built:
        yield built


def _answers(apps: dict[str, Any], instances: list[Any]) -> dict[str, tuple[int, bytes]]:
    answers: dict[str, tuple[int, bytes]] = {}
    for arch, client in apps.items():
        answer: Answer = client.request(
            "POST",
            "/v1/models/returns:predict",
            json={"instances": instances},
            headers={"X-Request-ID": REQUEST_ID},
        )
        answers[arch] = (answer.status, answer.body)
    return answers


def _same(answers: dict[str, tuple[int, bytes]]) -> None:
    assert len(set(answers.values())) == 1, answers


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(outputs=st.lists(OUTPUTS, min_size=1, max_size=3))
def test_what_predict_returns_is_answered_alike_everywhere(apps: dict[str, Any], outputs: list[Any]) -> None:
    _same(_answers(apps, outputs))


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "bool"])
@pytest.mark.parametrize("instances", [1, 2, 5])
def test_a_strided_column_of_the_batch_is_answered_alike_everywhere(
    apps: dict[str, Any], dtype: str, instances: int
) -> None:
    """`proba[:, 0]`: sync answered 500 `output_mismatch` for two instances or more, async and hybrid 200."""
    answers = _answers(apps, [{"column": dtype}] * instances)
    _same(answers)
    status, body = answers["sync"]
    assert status == 200, body
