"""Safe model loading on real files made here: skops, ONNX, safetensors / weights-only torch, and pickles."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import pytest
import skops.io as sio
import torch
from sklearn.datasets import load_iris
from sklearn.ensemble import RandomForestClassifier

import twinserve
from tests.serving import Server, model_path, predict
from twinserve import Config, ModelFileError, UntrustedModelFile

pytestmark = pytest.mark.timeout(120)

TREE = "sklearn.tree._tree.Tree"


class Payload:
    """What a malicious pickle carries: unpickling it creates a marker file (any code would run the same way)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


@pytest.fixture(scope="module")
def iris() -> tuple[RandomForestClassifier, np.ndarray[Any, Any]]:
    features, labels = load_iris(return_X_y=True)
    return RandomForestClassifier(n_estimators=5, random_state=0).fit(features, labels), features


# -- scikit-learn via skops ------------------------------------------------------------------------------------
def test_sklearn_loads_with_the_types_it_needs_trusted(iris: Any, tmp_path: Path) -> None:
    model, features = iris
    path = tmp_path / "iris.skops"
    sio.dump(model, path)
    loaded = twinserve.load_sklearn(path, trusted=[TREE])
    assert type(loaded) is RandomForestClassifier
    np.testing.assert_array_equal(loaded.predict_proba(features), model.predict_proba(features))


@pytest.mark.parametrize("trusted", [[], ["numpy.int64"]])
def test_sklearn_refuses_untrusted_types_and_names_them(iris: Any, tmp_path: Path, trusted: list[str]) -> None:
    path = tmp_path / "iris.skops"
    sio.dump(iris[0], path)
    with pytest.raises(UntrustedModelFile, match=r"holds types that are not trusted: \['sklearn.tree._tree.Tree'\]"):
        twinserve.load_sklearn(path, trusted=trusted)


def test_sklearn_refuses_a_pickle_without_unpickling_it(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "model.skops"
    path.write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(ModelFileError, match=r"is not a skops file.*--trust-pickle"):
        twinserve.load_sklearn(path)
    assert not marker.exists()
    with pytest.raises(ModelFileError, match="no such model file"):
        twinserve.load_sklearn(tmp_path / "missing.skops")


# -- pickles ---------------------------------------------------------------------------------------------------
def test_pickle_is_refused_without_trust_before_it_is_read(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "model.pkl"
    path.write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(UntrustedModelFile, match=r"runs any code it contains.*--trust-pickle"):
        twinserve.load_pickle(path, Config())
    assert not marker.exists()


def test_pickle_and_joblib_load_with_trust_and_a_warning(
    iris: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model, features = iris
    joblib.dump(model, tmp_path / "model.joblib")
    (tmp_path / "model.pkl").write_bytes(pickle.dumps({"weights": [1, 2]}))
    with caplog.at_level(logging.WARNING, logger="twinserve.loading"):
        loaded = twinserve.load_pickle(tmp_path / "model.joblib", Config(trust_pickle=True))
        plain = twinserve.load_pickle(tmp_path / "model.pkl", Config(trust_pickle=True))
    np.testing.assert_array_equal(loaded.predict(features), model.predict(features))
    assert plain == {"weights": [1, 2]}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and all("can run arbitrary code" in w and "--trust-pickle" in w for w in warnings)


# -- torch weights ---------------------------------------------------------------------------------------------
def _linear() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 3)


def test_safetensors_round_trip(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    original = _linear()
    path = tmp_path / "weights.safetensors"
    save_file(original.state_dict(), str(path))
    fresh = torch.nn.Linear(4, 3)
    fresh.load_state_dict(twinserve.load_torch_weights(path))
    x = torch.randn(5, 4)
    torch.testing.assert_close(fresh(x), original(x))
    (tmp_path / "bad.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelFileError, match="not a valid safetensors file"):
        twinserve.load_torch_weights(tmp_path / "bad.safetensors")


def test_torch_file_loads_weights_only(tmp_path: Path) -> None:
    original = _linear()
    torch.save(original.state_dict(), tmp_path / "weights.pt")
    fresh = torch.nn.Linear(4, 3)
    fresh.load_state_dict(twinserve.load_torch_weights(tmp_path / "weights.pt"))
    x = torch.randn(2, 4)
    torch.testing.assert_close(fresh(x), original(x))

    marker = tmp_path / "ran"
    torch.save({"weight": torch.zeros(2), "extra": Payload(marker)}, tmp_path / "evil.pt")
    with pytest.raises(UntrustedModelFile, match=r"weights_only=True\) refuses.*GLOBAL"):
        twinserve.load_torch_weights(tmp_path / "evil.pt")
    assert not marker.exists()
    torch.save(torch.zeros(3), tmp_path / "tensor.pt")
    with pytest.raises(ModelFileError, match="not a state dict"):
        twinserve.load_torch_weights(tmp_path / "tensor.pt")


# -- ONNX ------------------------------------------------------------------------------------------------------
def test_onnx_model_built_here_runs_on_the_cpu(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = rng.normal(size=(4, 3)).astype(np.float32)
    bias = rng.normal(size=(3,)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])],
        "affine",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])],
        initializer=[numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # onnxruntime reads IR versions up to its own; 8 goes with opset 17
    onnx.checker.check_model(model)
    path = tmp_path / "affine.onnx"
    onnx.save(model, str(path))

    session = twinserve.load_onnx(path)
    assert session.get_providers() == ["CPUExecutionProvider"]
    x = rng.normal(size=(5, 4)).astype(np.float32)
    (y,) = session.run(None, {"x": x})
    np.testing.assert_allclose(y, x @ weight + bias, rtol=1e-5)

    (tmp_path / "junk.onnx").write_bytes(b"junk")
    with pytest.raises(ModelFileError, match="is not a valid ONNX model"):
        twinserve.load_onnx(tmp_path / "junk.onnx")


# -- through the server ----------------------------------------------------------------------------------------
def test_server_refuses_a_pickled_model_unless_told_to_trust_it(iris: Any, tmp_path: Path) -> None:
    path = tmp_path / "iris.joblib"
    joblib.dump(iris[0], path)
    env = {"PICKLED_MODEL": str(path)}
    refused = Server([model_path("Pickled")], "async", env=env)
    with pytest.raises(RuntimeError, match="server exited") as failed:
        refused.start()
    assert "runs any code it contains" in str(failed.value)
    with Server([model_path("Pickled")], "async", "--trust-pickle", env=env) as server:
        answer = predict(server, "pickled", [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]])
        assert answer.json() == {"predictions": [0, 2]}
        server.wait_for_output("is trusted because of --trust-pickle")
