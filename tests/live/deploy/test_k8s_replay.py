"""Replay the Dockerfile `twinserve k8s --out` writes, without a container engine (none here can pull a base image):
its steps in order, with a folder standing in for the image's filesystem and a virtualenv for its Python, then one
prediction served over HTTP on 127.0.0.1.

Used two ways:

- `scripts/user-path.sh` runs this file as a script, on the standard library alone, in the fresh virtualenvs its
  stage 3 makes for the extras (`python tests/live/deploy/test_k8s_replay.py CONTEXT --venv DIR --made-with safe
  --model iris --instances JSON --expect JSON`): a skops model with its weights beside its module, and a model
  repository holding a torch model. That is where the image's pip step and its server are replayed for real.
- the tests below parse what k8s writes for the same two kinds of model and replay the steps that start nothing
  (the files laid out where the command looks; the extras the pip step asks for), in a second or so.

What each instruction becomes:

    FROM              the virtualenv's Python stands in for the base image's
    ENV               the server's environment
    COPY              files from the context to ROOT/<destination> (a relative one under WORKDIR), as Docker copies
    RUN pip install   VENV/bin/python -m pip install, the image's paths mapped under ROOT; with --made-with EXTRA
                      (the virtualenv was made by `pip install WHEEL[EXTRA]`, the same wheel) the step must ask for
                      exactly those extras, so that the virtualenv is what the step would make
    RUN rm            removed under ROOT
    RUN groupadd, useradd, USER   not replayed: the server runs as whoever runs the replay
    WORKDIR           the server's working directory
    EXPOSE            the port the HEALTHCHECK and the CMD name
    HEALTHCHECK       run once the server is ready, at its port: it must exit 0
    CMD               the server: `twinserve` from VENV/bin, bound to 127.0.0.1 and port 0 (the port it announces),
                      the image's absolute paths mapped under ROOT; SIGTERM must stop it with exit status 0

Any other instruction or RUN command fails the replay: a new step is taught here, never skipped unseen.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest

# Only the standard library at import: user-path.sh runs this file with a Python that has nothing else.
NOT_REPLAYED = frozenset({"groupadd", "useradd"})
READY_TIMEOUT_S = 300.0
#: Requests to the server go straight to loopback, whatever *_proxy variables say.
_LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Step:
    """One instruction of a Dockerfile, its continuation lines joined."""

    instruction: str
    args: str

    def json_args(self) -> list[str]:
        value = json.loads(self.args)
        assert isinstance(value, list) and all(isinstance(v, str) for v in value), self
        return value


@dataclass
class Image:
    """What the replayed steps made: where and how the CMD runs, and what the pip step asked for."""

    root: Path
    workdir: str = "/"
    env: dict[str, str] = field(default_factory=dict)
    port: int | None = None
    healthcheck: list[str] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    requirements: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)

    def path(self, image_path: str) -> Path:
        """Where a path of the image is under ROOT (a relative one is under WORKDIR)."""
        return self.root / PurePosixPath(self.workdir, image_path).as_posix().lstrip("/")

    @property
    def extras(self) -> list[list[str]]:
        """The extras each pip requirement asks for: `x.whl[safe,torch]` -> ["safe", "torch"]."""
        return [r.partition("[")[2].rstrip("]").split(",") if "[" in r else [] for r in self.requirements]


def parse(text: str) -> list[Step]:
    """The steps of a Dockerfile: comments and blank lines dropped, `\\` continuations joined."""
    steps: list[Step] = []
    pending = ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        instruction, _, args = (pending + line).strip().partition(" ")
        steps.append(Step(instruction.upper(), args.strip()))
        pending = ""
    assert not pending, f"a continuation line ends the Dockerfile: {pending!r}"
    return steps


def replay(
    steps: Sequence[Step], context: Path, root: Path, venv: Path | None, made_with: Sequence[str] | None = None
) -> Image:
    """Run `steps` from `context` into `root`; pip into `venv` (None: record what pip would install, run nothing)."""
    image = Image(root)
    for step in steps:
        if step.instruction == "FROM":
            image.log.append(f"FROM {step.args}: the virtualenv's Python stands in for it")
        elif step.instruction == "ENV":
            image.env.update(pair.split("=", 1) for pair in shlex.split(step.args))  # type: ignore[misc]
        elif step.instruction == "COPY":
            _copy(image, context, step.json_args())
        elif step.instruction == "RUN":
            _run(image, step.args, venv, made_with)
        elif step.instruction == "WORKDIR":
            image.workdir = PurePosixPath(image.workdir, step.args).as_posix()
            image.path(".").mkdir(parents=True, exist_ok=True)
        elif step.instruction == "USER":
            image.log.append(f"USER {step.args}: not replayed (the server runs as whoever runs the replay)")
        elif step.instruction == "EXPOSE":
            image.port = int(step.args)
        elif step.instruction == "HEALTHCHECK":
            image.healthcheck = json.loads(step.args.partition("CMD ")[2])  # its options are Docker's own
        elif step.instruction == "CMD":
            image.command = step.json_args()
        else:
            raise AssertionError(f"the replay does not know {step.instruction} (teach it): {step}")
    return image


def _copy(image: Image, context: Path, args: list[str]) -> None:
    *sources, destination = args
    into_folder = destination.endswith("/") or len(sources) > 1
    target = image.path(destination)
    for source in sources:
        local = context / source
        assert local.exists(), f"COPY {source}: not in the build context {context}"
        if local.is_dir():  # Docker copies a folder's contents
            shutil.copytree(local, target, dirs_exist_ok=True)
        else:
            final = target / local.name if into_folder else target
            final.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(local, final)
    image.log.append(f"COPY {' '.join(sources)} -> {destination}")


def _run(image: Image, args: str, venv: Path | None, made_with: Sequence[str] | None) -> None:
    words = shlex.split(args)
    commands: list[list[str]] = [[]]
    for word in words:
        if word == "&&":
            commands.append([])
        else:
            commands[-1].append(word)
    for command in commands:
        if command[:2] == ["pip", "install"]:
            _pip(image, command[2:], venv, made_with)
        elif command[0] == "rm" and len(command) == 2:
            image.path(command[1]).unlink()
        elif command[0] in NOT_REPLAYED:
            image.log.append(f"RUN {command[0]}: not replayed (the server runs as whoever runs the replay)")
        else:
            raise AssertionError(f"the replay does not know RUN {shlex.join(command)} (teach it)")


def _pip(image: Image, args: list[str], venv: Path | None, made_with: Sequence[str] | None) -> None:
    mapped = []
    for arg in args:
        assert not arg.startswith("-"), f"RUN pip install {arg}: the replay knows no pip option (teach it)"
        path, bracket, extras = arg.partition("[")
        image.requirements.append(arg)
        mapped.append(str(image.path(path)) + bracket + extras)
    if made_with is not None:
        asked = sorted({extra for extras in image.extras for extra in extras if extra})
        assert asked == sorted(made_with), (
            f"the pip step asks for the extras {asked}; the virtualenv standing in for it was made with "
            f"{sorted(made_with)}"
        )
    if venv is None:
        image.log.append(f"RUN pip install {shlex.join(args)}: not run (no virtualenv given)")
        return
    started = time.monotonic()
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", *mapped],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, **image.env},
    )
    assert done.returncode == 0, f"RUN pip install {shlex.join(mapped)}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    image.log.append(f"RUN pip install {shlex.join(args)}: {time.monotonic() - started:.1f} s")


def server_command(image: Image, venv: Path) -> list[str]:
    """The CMD as it runs here: the virtualenv's script, on 127.0.0.1 port 0, the image's paths under ROOT."""
    command = list(image.command)
    script = shutil.which(command[0], path=str(venv / "bin"))
    assert script is not None, f"CMD {command[0]}: not in {venv / 'bin'}"
    command[0] = script
    for flag, value in (("--host", "127.0.0.1"), ("--port", "0")):
        assert flag in command, f"the CMD has no {flag}: {image.command}"
        command[command.index(flag) + 1] = value
    return [image.path(arg).as_posix() if arg.startswith("/") and image.path(arg).exists() else arg for arg in command]


def serve_and_predict(image: Image, venv: Path, model: str, instances: Any, log: Path) -> Any:
    """Start the CMD, wait for it to be ready, run the HEALTHCHECK, predict `instances`, stop it with SIGTERM."""
    env = {**os.environ, **image.env, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTHONPATH", None)  # the image has only what its steps installed
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"  # the HEALTHCHECK's urllib honours *_proxy
    command = server_command(image, venv)
    image.log.append(f"CMD run as: {shlex.join(command)}")
    with log.open("w") as output:
        server = subprocess.Popen(command, cwd=image.path("."), env=env, stdout=output, stderr=subprocess.STDOUT)
    try:
        url = _wait_ready(server, log)
        assert image.port is not None and image.healthcheck, "the Dockerfile has no EXPOSE or HEALTHCHECK"
        port = url.rsplit(":", 1)[1]
        health = [arg.replace(f":{image.port}/", f":{port}/") for arg in image.healthcheck]
        health[0] = shutil.which(health[0], path=str(venv / "bin")) or health[0]
        assert subprocess.run(health, env=env, timeout=30).returncode == 0, f"HEALTHCHECK {health} failed"
        image.log.append(f"HEALTHCHECK: exit 0 against {url} (the port the server announced)")
        body = json.dumps({"instances": instances}).encode()
        request = urllib.request.Request(f"{url}/v1/models/{model}:predict", body, {"content-type": "application/json"})
        with _LOOPBACK.open(request, timeout=60) as response:
            predictions = json.loads(response.read())["predictions"]
    except BaseException:
        _stop(server)
        raise
    code = _stop(server)
    assert code == 0, f"the server exited {code} after SIGTERM:\n{_tail(log)}"
    return predictions


def _stop(server: subprocess.Popen[bytes]) -> int:
    server.send_signal(signal.SIGTERM)
    try:
        return server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        return server.wait()


def _wait_ready(server: subprocess.Popen[bytes], log: Path) -> str:
    """The URL the server announced, once its readiness endpoint answers 200."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    url = None
    while time.monotonic() < deadline:
        assert server.poll() is None, f"the server exited {server.returncode} before it was ready:\n{_tail(log)}"
        url = url or _announced(log.read_text(errors="replace"))
        if url is not None:
            try:
                with _LOOPBACK.open(f"{url}/v2/health/ready", timeout=2) as response:
                    if response.status == 200:
                        return url
            except (urllib.error.URLError, OSError):
                pass
        time.sleep(0.2)
    raise AssertionError(f"the server was not ready within {READY_TIMEOUT_S:g} s:\n{_tail(log)}")


def _announced(output: str) -> str | None:
    """The URL of twinserve's JSON `serving` event (twinserve.lab.servers.announced_url, without its imports)."""
    for line in output.splitlines():
        if line.startswith("{") and '"serving"' in line:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("event") == "serving" and isinstance(event.get("url"), str):
                return str(event["url"])
    return None


def _tail(log: Path) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-40:])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("context", type=Path, help="the folder `twinserve k8s --out` wrote")
    parser.add_argument("--venv", type=Path, required=True, help="the virtualenv standing in for the image's Python")
    parser.add_argument("--made-with", action="append", help="the extras the virtualenv was made with (repeatable)")
    parser.add_argument("--model", required=True, help="the served model name to predict with")
    parser.add_argument("--instances", type=json.loads, required=True, help="the request's instances (JSON)")
    parser.add_argument("--expect", type=json.loads, required=True, help="the predictions expected (JSON)")
    args = parser.parse_args(argv)
    steps = parse((args.context / "Dockerfile").read_text())
    with tempfile.TemporaryDirectory(prefix="replay-") as folder:
        root = Path(folder)
        image = Image(root / "image")
        try:
            image = replay(steps, args.context, root / "image", args.venv, args.made_with)
            predictions = serve_and_predict(image, args.venv, args.model, args.instances, root / "server.log")
        finally:
            for line in image.log:  # what was replayed, before any failure
                print(f"replay: {line}")
    assert predictions == args.expect, f"predicted {predictions}, expected {args.expect}"
    print(f"replay: CMD {shlex.join(image.command)}: served {args.model!r}, predicted {predictions}")
    return 0


# -- the steps that start nothing, in the suite -------------------------------------------------------------------
# twinserve is imported inside the tests: at import this module must need nothing but the standard library.

SKOPS_MODEL = """
from pathlib import Path

import twinserve


class Iris(twinserve.Model):
    def load(self) -> None:
        self.clf = twinserve.load_sklearn(Path(__file__).with_name("bc.skops"))

    def predict(self, batch: list[list[float]]) -> list[int]:
        return [int(label) for label in self.clf.predict(batch)]
"""


def k8s_out(project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """`twinserve k8s --image i --arch async --out out ARGV...` run in `project`; what it printed."""
    from twinserve.cli import main as twinserve

    monkeypatch.chdir(project)
    assert twinserve(["k8s", "--image", "i", "--arch", "async", "--out", "out", *argv]) == 0
    return capsys.readouterr().out


def test_a_skops_model_carries_its_weights_and_installs_the_safe_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #43's case: the weights beside the module reach the image's WORKDIR, pip asks for `safe`."""
    folder = tmp_path / "models" / "iris"
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(SKOPS_MODEL)
    (folder / "bc.skops").write_bytes(b"PK weights")
    printed = k8s_out(tmp_path, monkeypatch, capsys, "models/iris/model.py:Iris")
    assert "carried models/iris/bc.skops (10 B): beside models/iris/model.py" in printed
    assert "extra safe: models/iris/model.py calls twinserve's load_sklearn" in printed
    context = tmp_path / "out"
    image = replay(parse((context / "Dockerfile").read_text()), context, tmp_path / "image", None, ["safe"])
    assert image.extras == [["safe"]]
    assert (image.path("models/iris/bc.skops")).read_bytes() == b"PK weights"
    assert image.path(".") == tmp_path / "image" / "app"
    command = server_command(image, Path(sys.prefix))
    assert command[2] == "models/iris/model.py:Iris" and (image.path(".") / command[2].split(":")[0]).is_file()
    assert not image.path(f"/tmp/wheels/{next(context.glob('*.whl')).name}").exists()  # RUN rm


def test_a_repository_of_a_torch_model_is_at_models_and_installs_the_torch_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    version = tmp_path / "repo" / "mlp" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(
        "import torch\n\nclass Mlp:\n    def predict(self, batch):\n        return batch\n"
    )
    (version / "weights.pt").write_bytes(b"weights")
    (version.parent / "twinserve.toml").write_text('model = "model.py:Mlp"\n')
    printed = k8s_out(tmp_path, monkeypatch, capsys, "--model-repository", "repo")
    assert "extra torch: repo/mlp/1/model.py imports torch; repo/mlp/1/weights.pt is a .pt file" in printed
    context = tmp_path / "out"
    image = replay(parse((context / "Dockerfile").read_text()), context, tmp_path / "image", None, ["torch"])
    assert image.path("/models/mlp/1/weights.pt").read_bytes() == b"weights"
    command = server_command(image, Path(sys.prefix))
    assert command[command.index("--model-repository") + 1] == str(image.path("/models"))


def test_the_replay_refuses_a_step_it_does_not_know_and_a_venv_made_otherwise(tmp_path: Path) -> None:
    import pytest

    for text in ("ARG X=1\n", "RUN apt-get install -y curl\n", "RUN pip install --pre x.whl\n"):
        with pytest.raises(AssertionError, match="teach it"):
            replay(parse(text), tmp_path, tmp_path / "image", None)
    steps = parse('RUN pip install "/tmp/wheels/t.whl[safe]" \\\n && rm /tmp/wheels/t.whl\n')
    assert steps == [Step("RUN", 'pip install "/tmp/wheels/t.whl[safe]"  && rm /tmp/wheels/t.whl')]
    with pytest.raises(
        AssertionError, match=r"asks for the extras \['safe'\]; the virtualenv .* made with \['torch'\]"
    ):
        replay(steps, tmp_path, tmp_path / "image", None, made_with=["torch"])


if __name__ == "__main__":
    sys.exit(main())
