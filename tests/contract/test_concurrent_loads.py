"""Loads asked at once (repository/control.py): identical loads merge, and in the sync architecture changes never
take every request thread (issue #44: eight concurrent loads of a model whose load() took 15 s cost 117 s, and held
sync's request threads until a predict on another model timed out). In process, in every architecture."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.inprocess import ARCHS_IN_PROCESS, AsyncClient, SyncClient, served
from tests.serving import wait_until

Client = SyncClient | AsyncClient
#: Each load() notes itself in `loads` beside the repository, then waits for the file `open` there.
GATED = """
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Gated:
    def load(self):
        with (ROOT / "loads").open("a") as loads:
            loads.write("load\\n")
        deadline = time.monotonic() + 60
        while not (ROOT / "open").exists() and time.monotonic() < deadline:
            time.sleep(0.01)

    def predict(self, batch):
        return batch
"""
PLAIN = "class Plain:\n    def predict(self, batch):\n        return batch\n"
LOAD = "/v2/repository/models/gated/load"


def _repository(root: Path) -> Path:
    for name, code, cls in (("gated", GATED, "Gated"), ("plain", PLAIN, "Plain")):
        (root / name).mkdir(parents=True)
        (root / name / "model.py").write_text(code)
        (root / name / "twinserve.toml").write_text(f'model = "model.py:{cls}"\n')
    (root / "open").touch()  # the start-up load passes
    return root


def _loads(root: Path) -> int:
    return len((root / "loads").read_text().splitlines())


def _in_flight(app: Client) -> float:
    text = app.request("GET", "/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("twinserve_in_flight_requests"))


@pytest.fixture(params=ARCHS_IN_PROCESS)
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Client, Path]]:
    root = _repository(tmp_path / "repository")
    with served(request.param, [], model_repository=str(root), model_control="explicit", workers=1, threads=16) as app:
        yield app, root


def test_identical_loads_merge(app: tuple[Client, Path]) -> None:
    client, root = app
    (root / "open").unlink()
    started = _loads(root)
    with ThreadPoolExecutor(6) as pool:
        first = pool.submit(client.request, "POST", LOAD)
        wait_until(lambda: _loads(root) == started + 1, what="the first load to start")
        others = [pool.submit(client.request, "POST", LOAD) for _ in range(5)]
        wait_until(lambda: _in_flight(client) >= 6, what="the other five to be asked")
        (root / "open").touch()
        answers = [first.result(timeout=120), *(other.result(timeout=120) for other in others)]
    assert [a.status for a in answers] == [200] * 6, [a.text for a in answers]
    # The first, then one for the five asked while it ran (two when one of them came in as its successor began):
    # six without merging.
    assert 2 <= _loads(root) - started <= 3


def test_sync_changes_leave_threads_for_predicts(tmp_path: Path) -> None:
    root = _repository(tmp_path / "repository")
    flags = {"model_repository": str(root), "model_control": "explicit", "workers": 1, "threads": 4}
    with served("sync", [], **flags) as client, ThreadPoolExecutor(2) as pool:
        (root / "open").unlink()  # loaded at start: from now on a load waits
        held = [pool.submit(client.request, "POST", LOAD) for _ in range(2)]  # half of 4 threads
        wait_until(lambda: _in_flight(client) >= 2, what="two loads to hold their threads")
        refused = client.request("POST", "/v2/repository/models/plain/unload")
        assert refused.status == 503 and refused.headers["retry-after"] == "1", refused.text
        assert "busy loading or unloading" in refused.text
        predicted = client.request("POST", "/v1/models/plain:predict", json={"instances": [1]})
        assert predicted.status == 200, predicted.text
        (root / "open").touch()
        assert [answer.result(timeout=120).status for answer in held] == [200, 200]
