"""Models loaded on demand with LRU eviction (`--max-loaded-models`), and requests that wait for a loading model
(twinserve/repository/residency.py): in process in every architecture, and on real servers for memory."""

from __future__ import annotations

import contextlib
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import ARCHS
from tests.inprocess import ARCHS_IN_PROCESS, AsyncClient, SyncClient, served
from tests.live.test_repository import RAISES
from tests.serving import HTTP, Server, wait_for_file
from twinserve.config import load_config
from twinserve.errors import ConfigError

Client = SyncClient | AsyncClient
MiB = 1 << 20
#: What each model of the memory test holds once loaded.
HELD_MIB = 50

#: A model that says which folder it is; its load() holds `HOLD_MIB` MiB (read from a file beside it), resident.
NAMED = textwrap.dedent(
    """
    from pathlib import Path

    import twinserve


    class Named(twinserve.Model):
        def load(self):
            here = Path(__file__).parent
            self.name_of = here.name
            hold = here / "hold_mib.txt"
            # Ones, not zeros: a zeroed block may be mapped lazily and never count as resident.
            self.ballast = b"\\x01" * (int(hold.read_text()) << 20) if hold.exists() else b""

        def predict(self, batch: list[int]) -> list[str]:
            return [self.name_of for _ in batch]
    """
)
#: A model whose load() waits until the test writes `release` beside it (a file, not a timer).
SLOW = textwrap.dedent(
    """
    import time
    from pathlib import Path

    import twinserve


    class Slow(twinserve.Model):
        def load(self):
            release = Path(__file__).parent / "release"
            give_up = time.monotonic() + 300
            while not release.exists():
                if time.monotonic() > give_up:
                    raise RuntimeError("never released")
                time.sleep(0.01)

        def predict(self, batch: list[int]) -> list[str]:
            return ["slow" for _ in batch]
    """
)


def _model(root: Path, name: str, source: str = NAMED, hold_mib: int | None = None) -> None:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    cls = {NAMED: "Named", SLOW: "Slow", RAISES: "Broken"}[source]
    (folder / "twinserve.toml").write_text(f'model = "model.py:{cls}"\n')
    (folder / "model.py").write_text(source)
    if hold_mib is not None:
        (folder / "hold_mib.txt").write_text(str(hold_mib))


def _states(app: Client) -> dict[str, str]:
    index = app.request("POST", "/v2/repository/index", json={})
    assert index.status == 200, index.text
    return {f"{e['name']}:{e['reason']}" if e["reason"] else e["name"]: e["state"] for e in index.json()}


def _ready(app: Client) -> list[str]:
    return sorted(name for name, state in _states(app).items() if state == "READY")


def _ask(app: Client, model: str, headers: dict[str, str] | None = None) -> Any:
    return app.request("POST", f"/v1/models/{model}:predict", json={"instances": [1]}, headers=headers)


def _scraped(app: Client, line_start: str) -> float:
    text = app.request("GET", "/metrics").text
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start)]
    return sum(values)


@pytest.fixture
def three(tmp_path: Path) -> Path:
    root = tmp_path / "repository"
    for name in ("alpha", "beta", "gamma"):
        _model(root, name)
    return root


def test_the_bound_needs_a_repository_and_is_refused_with_poll(three: Path) -> None:
    with pytest.raises(ConfigError, match="--max-loaded-models needs --model-repository"):
        load_config(max_loaded_models=1)
    with pytest.raises(ConfigError, match="--max-loaded-models"):
        load_config(model_repository=str(three), max_loaded_models=1, model_control="poll")
    with pytest.raises(ConfigError, match="max-loaded-models"):
        load_config(model_repository=str(three), max_loaded_models=0)
    assert load_config(model_repository=str(three), max_loaded_models=2).max_loaded_models == 2


@pytest.mark.parametrize("arch", ARCHS_IN_PROCESS)
def test_one_model_loaded_at_a_time_serves_them_all(three: Path, arch: str) -> None:
    """The first model by name loads at start, the others are cold; each request for a cold or evicted model
    loads it (and waits) and evicts the least recently used; the index shows one READY at a time."""
    with served(arch, [], model_repository=str(three), max_loaded_models=1, workers=1) as app:
        assert _states(app) == {"alpha": "READY", "beta:cold": "UNAVAILABLE", "gamma:cold": "UNAVAILABLE"}
        for _ in range(2):
            for name in ("alpha", "beta", "gamma"):
                answer = _ask(app, name)
                assert answer.status == 200, answer.text
                assert answer.json()["predictions"] == [name]
                assert _ready(app) == [name]
        assert _states(app) == {"alpha:evicted": "UNAVAILABLE", "beta:evicted": "UNAVAILABLE", "gamma": "READY"}
        # V2 and versioned routes load on demand too.
        body = {"inputs": [{"name": "input", "datatype": "INT64", "shape": [1], "data": [1]}]}
        assert app.request("POST", "/v2/models/beta/versions/1/infer", json=body).status == 200
        assert _ready(app) == ["beta"]
        assert _scraped(app, 'twinserve_model_evictions_total{model="alpha"}') >= 2
        assert _scraped(app, 'twinserve_model_load_seconds_count{model="beta",version="1"}') >= 3


@pytest.mark.parametrize("arch", ARCHS_IN_PROCESS)
def test_the_least_recently_used_is_evicted(three: Path, arch: str) -> None:
    with served(arch, [], model_repository=str(three), max_loaded_models=2, workers=1) as app:
        assert _ready(app) == ["alpha", "beta"]
        assert _ask(app, "alpha").status == 200  # beta is now the least recently used
        assert _ask(app, "gamma").status == 200
        assert _ready(app) == ["alpha", "gamma"]
        assert _states(app)["beta:evicted"] == "UNAVAILABLE"


@pytest.mark.parametrize("arch", ARCHS_IN_PROCESS)
def test_a_request_waits_for_a_slow_load_up_to_its_deadline(tmp_path: Path, arch: str) -> None:
    """A short deadline ends in 504 while the model loads (the load goes on); once loaded, requests get 200."""
    root = tmp_path / "repository"
    _model(root, "alpha")
    _model(root, "slow", SLOW)
    with served(arch, [], model_repository=str(root), max_loaded_models=1, workers=1) as app:
        late = _ask(app, "slow", {"X-Request-Timeout-Ms": "300"})
        assert late.status == 504, late.text
        assert late.json()["code"] == "deadline_exceeded"
        assert _states(app)["slow"] == "LOADING"
        late = _ask(app, "slow", {"X-Request-Timeout-Ms": "100"})  # a second waiter starts no second load
        assert late.status == 504, late.text
        (root / "slow" / "release").write_text("")
        answer = _ask(app, "slow", {"X-Request-Timeout-Ms": "120000"})
        assert answer.status == 200, answer.text
        assert answer.json()["predictions"] == ["slow"]
        assert _states(app) == {"alpha:evicted": "UNAVAILABLE", "slow": "READY"}


@pytest.mark.parametrize("arch", ARCHS_IN_PROCESS)
def test_a_load_that_raises_answers_503_and_the_others_serve(tmp_path: Path, arch: str) -> None:
    root = tmp_path / "repository"
    _model(root, "alpha")
    _model(root, "broken", RAISES)
    with served(arch, [], model_repository=str(root), max_loaded_models=1, workers=1) as app:
        failed = _ask(app, "broken")
        assert failed.status == 503, failed.text
        assert failed.json()["code"] == "model_unavailable"
        assert "its load() failed" in failed.text
        again = _ask(app, "broken")  # a failed load is not retried on every request
        assert again.status == 503 and "its load() failed" in again.text
        assert _ask(app, "alpha").status == 200
        assert _ready(app) == ["alpha"]


@pytest.mark.parametrize("arch", ARCHS_IN_PROCESS)
def test_an_explicit_unload_is_not_undone_by_requests(three: Path, arch: str) -> None:
    flags: dict[str, Any] = {"max_loaded_models": 1, "model_control": "explicit", "workers": 1}
    with served(arch, [], model_repository=str(three), **flags) as app:
        assert app.request("POST", "/v2/repository/models/alpha/unload", json={}).status == 200
        refused = _ask(app, "alpha")
        assert refused.status == 503 and refused.json()["code"] == "model_unavailable"
        assert _ask(app, "beta").status == 200  # a cold model still loads on demand
        assert app.request("POST", "/v2/repository/models/alpha/load", json={}).status == 200
        assert _ask(app, "alpha").status == 200


# -- real servers: memory ------------------------------------------------------------------------------------
def _tree_rss(pid: int) -> int:
    """Resident memory of a server and every process under it (workers, model workers)."""
    root = psutil.Process(pid)
    total = 0
    for process in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):  # a model worker that just ended holds nothing
            total += process.memory_info().rss
    return total


@pytest.fixture
def heavy(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "repository"
    for name in ("alpha", "beta", "gamma"):
        _model(root, name, hold_mib=HELD_MIB)
    yield root


@pytest.mark.parametrize("arch", ARCHS)
def test_eviction_keeps_the_servers_memory_bounded(heavy: Path, arch: str) -> None:
    """Cycling through three models that each hold 50 MiB with one loaded at a time: the server tree's resident
    memory never grows by what a second model would add. All three at once would be 100 MiB (and in hybrid two
    model-worker processes) more than one."""
    with Server([], arch, "--model-repository", str(heavy), "--max-loaded-models", "1", "--workers", "1") as server:

        def ask(name: str) -> None:
            answer = HTTP.post(f"{server.url}/v1/models/{name}:predict", json={"instances": [1]}, timeout=120)
            assert answer.status_code == 200, answer.text
            assert answer.json()["predictions"] == [name]

        ask("alpha")
        ask("beta")  # one eviction and one load on demand behind us: the allocator's steady state
        baseline = _tree_rss(server.pid)
        peak = baseline
        for _ in range(3):
            for name in ("gamma", "alpha", "beta"):
                ask(name)
                peak = max(peak, _tree_rss(server.pid))
        assert peak - baseline < HELD_MIB * MiB, f"grew by {(peak - baseline) / MiB:.0f} MiB over {baseline / MiB:.0f}"


#: A model whose predict says it started (`entered`) and waits until the test writes `release`: a request inside.
HELD = NAMED.replace(
    "        return [self.name_of for _ in batch]",
    "        (Path(__file__).parent / 'entered').write_text('')\n"
    "        while not (Path(__file__).parent / 'release').exists():\n"
    "            time.sleep(0.01)\n"
    "        return [self.name_of for _ in batch]",
).replace("from pathlib import Path\n", "import time\nfrom pathlib import Path\n")
assert "entered" in HELD


@pytest.mark.parametrize("arch", ARCHS_IN_PROCESS)
def test_a_model_with_a_request_inside_is_not_evicted_while_another_can_go(tmp_path: Path, arch: str) -> None:
    root = tmp_path / "repository"
    for name in ("alpha", "beta", "gamma"):
        _model(root, name)
    (root / "alpha" / "model.py").write_text(HELD)
    with served(arch, [], model_repository=str(root), max_loaded_models=2, workers=1) as app:
        inside: dict[str, Any] = {}
        held = threading.Thread(target=lambda: inside.setdefault("answer", _ask(app, "alpha")))
        held.start()
        try:
            wait_for_file(root / "alpha" / "entered", timeout=120)
            assert _ask(app, "beta").status == 200  # alpha is the least recently used, but it has a request inside
            assert _ask(app, "gamma").status == 200
            assert _ready(app) == ["alpha", "gamma"]
            assert _states(app)["beta:evicted"] == "UNAVAILABLE"
        finally:
            (root / "alpha" / "release").write_text("")
            held.join(timeout=120)
        assert inside["answer"].status == 200
