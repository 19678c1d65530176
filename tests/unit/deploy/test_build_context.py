"""What `twinserve k8s --out` carries into the image's build context (`deploy.context`): the files beside a model's
module or those it declares, a package folder with its data files, a repository; and what it skips, and why."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

import pytest

from twinserve.deploy.commands import k8s_config
from twinserve.deploy.context import BuildContext, copy_context, discover
from twinserve.deploy.dockerfile import dockerfile
from twinserve.errors import ConfigError

MODEL = (
    "import twinserve\n\n\nclass Iris(twinserve.Model):\n{body}    def predict(self, batch):\n        return batch\n"
)


def model_source(files: str | None = None) -> str:
    return MODEL.format(body="" if files is None else f"    files = {files}\n\n")


def write(path: Path, text: str = "x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def found(tmp_path: Path, *models: str, out: str = "out", in_image: bool = True, **settings: object) -> BuildContext:
    config = k8s_config({"models": list(models), **settings} if models else settings)
    return discover(config, tmp_path, Path(out), repository_in_image=in_image)


def carried(context: BuildContext) -> dict[str, str]:
    return {str(c.path): c.why for c in context.carried}


def skipped(context: BuildContext) -> dict[str, str]:
    return {s.path: s.why for s in context.skipped}


def test_the_files_beside_the_module_are_carried_and_what_is_not_is_said(tmp_path: Path) -> None:
    folder = tmp_path / "models" / "iris"
    write(folder / "model.py", model_source())
    write(folder / "bc.skops")
    write(folder / "labels.json")
    write(folder / ".env", "SECRET=1")
    write(folder / "__pycache__" / "model.cpython-311.pyc")
    write(folder / "stale.pyc")
    write(folder / "notes" / "a.txt")
    write(folder / "venv" / "pyvenv.cfg")
    context = found(tmp_path, "models/iris/model.py:Iris")
    assert carried(context) == {
        "models/iris/model.py": "the module of models/iris/model.py:Iris",  # first: the order found
        "models/iris/bc.skops": "beside models/iris/model.py",
        "models/iris/labels.json": "beside models/iris/model.py",
    }
    assert skipped(context) == {
        "models/iris/.env": "hidden",
        "models/iris/__pycache__/": "bytecode",
        "models/iris/notes/": "a folder beside models/iris/model.py: name it in the model's files to carry it",
        "models/iris/stale.pyc": "bytecode",
        "models/iris/venv/": "a virtualenv",
    }
    assert {label for _, label in context.scanned} == set(carried(context))  # what is carried is read for extras
    assert context.describe()[1] == "carried models/iris/bc.skops (1 B): beside models/iris/model.py"


def test_a_model_at_the_top_sweeps_only_the_top_files_and_never_the_out_folder_or_its_outputs(
    tmp_path: Path,
) -> None:
    write(tmp_path / "model.py", model_source())
    write(tmp_path / "bc.skops")
    write(tmp_path / "data" / "train.csv")
    write(tmp_path / "deploy" / "Dockerfile")
    context = found(tmp_path, "model.py:Iris", out="deploy")
    assert list(carried(context)) == ["model.py", "bc.skops"]
    assert skipped(context)["deploy/"] == "the --out folder itself"
    assert skipped(context)["data/"].startswith("a folder beside model.py")
    # --out . : the folder k8s writes into is the model's own; what it wrote there stays out
    for name in ("Dockerfile", "kubernetes.yaml", "twinserve-0.1.0-py3-none-any.whl"):
        write(tmp_path / name)
    context = found(tmp_path, "model.py:Iris", out=".")
    assert list(carried(context)) == ["model.py", "bc.skops"]
    assert skipped(context)["Dockerfile"] == "written by twinserve k8s --out"


def test_declared_files_are_carried_instead_of_the_sweep(tmp_path: Path) -> None:
    folder = tmp_path / "models" / "iris"
    write(folder / "model.py", model_source('["weights/", "../shared/vocab.txt"]'))
    write(folder / "weights" / "bc.skops")
    write(folder / "weights" / "__pycache__" / "x.pyc")
    write(folder / "unrelated.csv")
    write(tmp_path / "models" / "shared" / "vocab.txt")
    context = found(tmp_path, "models/iris/model.py:Iris")
    assert carried(context) == {
        "models/iris/model.py": "the module of models/iris/model.py:Iris",
        "models/iris/weights": "declared in Iris.files",
        "models/shared/vocab.txt": "declared in Iris.files",
    }
    (weights,) = [c for c in context.carried if c.is_dir]
    assert weights.files == (PurePosixPath("models/iris/weights/bc.skops"),)
    assert skipped(context) == {"models/iris/weights/__pycache__/": "bytecode"}
    # Declared empty: the module alone.
    write(folder / "model.py", model_source("()"))
    assert list(carried(found(tmp_path, "models/iris/model.py:Iris"))) == ["models/iris/model.py"]


@pytest.mark.parametrize(
    ("files", "error"),
    [
        ('["missing.skops"]', "Iris.files names 'missing.skops', and there is no models/iris/missing.skops"),
        ('["../../../outside.txt"]', "relative to the current folder and inside it"),
        ("WEIGHTS", "must be a literal list of relative paths"),
        ('[""]', "must be a literal list of relative paths"),
    ],
)
def test_a_declared_file_must_be_there_inside_and_literal(tmp_path: Path, files: str, error: str) -> None:
    write(tmp_path / "models" / "iris" / "model.py", model_source(files))
    with pytest.raises(ConfigError, match=error.replace("(", r"\(")):
        found(tmp_path, "models/iris/model.py:Iris")


def test_a_package_in_the_working_directory_is_carried_with_its_data_files(tmp_path: Path) -> None:
    write(tmp_path / "scorers" / "__init__.py", "")
    write(tmp_path / "scorers" / "fast.py", model_source('["weights.onnx", "../vocab.txt"]').replace("Iris", "Fast"))
    write(tmp_path / "scorers" / "weights.onnx")
    write(tmp_path / "scorers" / "__pycache__" / "fast.pyc")
    write(tmp_path / "scorers" / ".git" / "HEAD")
    write(tmp_path / "vocab.txt")
    context = found(tmp_path, "scorers.fast:Fast")
    # The declared file inside the package rides with it; the one outside is carried too.
    assert carried(context) == {"scorers": "the package of scorers.fast:Fast", "vocab.txt": "declared in Fast.files"}
    (package,) = [c for c in context.carried if c.is_dir]
    assert [str(f) for f in package.files] == ["scorers/__init__.py", "scorers/fast.py", "scorers/weights.onnx"]
    assert (
        package.describe()
        == f"scorers/ (3 files, {package.size} B): the package of scorers.fast:Fast; holds weights.onnx"
    )
    assert skipped(context) == {"scorers/.git/": "hidden", "scorers/__pycache__/": "bytecode"}


def test_installed_models_carry_nothing_and_twinserve_s_own_source_is_read(tmp_path: Path) -> None:
    context = found(tmp_path, "twinserve.examples.embed:MiniLM", "somepkg.mod:Model")
    assert context.carried == []
    assert [label for _, label in context.scanned] == ["twinserve.examples.embed"]
    assert context.scanned[0][0].name == "embed.py"
    (note,) = context.notes
    assert note.startswith("somepkg.mod:Model is not in the working directory: not carried")


@pytest.mark.parametrize("in_image", [True, False])
def test_a_repository_is_carried_whole_or_only_read_when_a_volume_holds_it(tmp_path: Path, in_image: bool) -> None:
    repository = tmp_path / "repo"
    write(repository / "mlp" / "twinserve.toml", 'model = "model.py:Mlp"\n')
    write(repository / "mlp" / "1" / "model.py", "import torch\n")
    write(repository / "mlp" / "1" / "weights.pt")
    write(repository / "mlp" / "1" / "__pycache__" / "model.pyc")
    write(repository / ".git" / "HEAD")
    context = found(tmp_path, model_repository=repository, in_image=in_image)
    files = {str(repository / "mlp" / "twinserve.toml"), str(repository / "mlp/1/model.py")}
    assert files | {str(repository / "mlp/1/weights.pt")} == {label for _, label in context.scanned}
    if in_image:
        assert context.repository is not None and context.repository.files == (
            PurePosixPath("model-repository/mlp/1/model.py"),
            PurePosixPath("model-repository/mlp/1/weights.pt"),
            PurePosixPath("model-repository/mlp/twinserve.toml"),
        )
        assert context.repository.describe().endswith("at /models in the image; holds mlp/1/weights.pt")
        assert set(skipped(context)) == {f"{repository}/.git/", f"{repository}/mlp/1/__pycache__/"}
    else:
        assert context.repository is None and context.carried == [] and context.skipped == []
        assert "--repository-volume mounts it at /models" in context.notes[0]


def test_copy_lays_each_path_in_the_context_afresh(tmp_path: Path) -> None:
    project = tmp_path / "project"
    write(project / "scorers" / "__init__.py", "")
    write(project / "scorers" / "weights.onnx")
    write(project / "models" / "iris" / "model.py", model_source())
    write(project / "models" / "iris" / "bc.skops", "weights")
    write(project / "models" / "iris" / ".env")
    out = tmp_path / "out"
    write(out / "scorers" / "stale.onnx")  # from an earlier run: gone from the project since
    context = found(project, "scorers.x:Fast", "models/iris/model.py:Iris", out=str(out))
    copy_context(context, out)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == [
        "models/iris/bc.skops",
        "models/iris/model.py",
        "scorers/__init__.py",
        "scorers/weights.onnx",
    ]
    copy_context(found(project, "models/iris/model.py:Iris", out="."), project)  # onto itself: nothing to do
    assert (project / "models" / "iris" / "bc.skops").read_text() == "weights"


def test_the_dockerfile_copies_a_folder_s_files_in_one_layer_and_says_what_and_why(tmp_path: Path) -> None:
    write(tmp_path / "model.py", model_source())
    write(tmp_path / "bc.skops")
    write(tmp_path / "models" / "iris" / "model.py", model_source())
    write(tmp_path / "models" / "iris" / "bc.skops")
    context = found(tmp_path, "model.py:Iris", "models/iris/model.py:Iris")
    config = k8s_config({"models": ["model.py:Iris", "models/iris/model.py:Iris"]})
    reasons = {"safe": ["model.py calls twinserve's load_sklearn", "bc.skops is a .skops file"]}
    lines = dockerfile(config, "twinserve-0-py3-none-any.whl", reasons, context).splitlines()
    copies = [json.loads(line[5:]) for line in lines if line.startswith("COPY ")]
    assert copies[1:] == [
        ["model.py", "bc.skops", "./"],
        ["models/iris/model.py", "models/iris/bc.skops", "models/iris/"],
    ]
    assert "#   safe: model.py calls twinserve's load_sklearn; bc.skops is a .skops file" in lines
    assert "#   carried models/iris/bc.skops (1 B): beside models/iris/model.py" in lines
    assert 'RUN pip install "/tmp/wheels/twinserve-0-py3-none-any.whl[safe]"' in "\n".join(lines)
    plain = dockerfile(config, "twinserve-0-py3-none-any.whl")
    assert "# with no extra: none found in the models' imports, files or settings" in plain
