"""`lab.probe.settle`: tune waits for a server's backlog to drain before its next probe on it counts."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.conftest import ARCHS
from tests.serving import Server, model_path, predict, wait_for_file
from twinserve.lab.probe import settle


@pytest.mark.parametrize("arch", ARCHS)
def test_settle_waits_while_a_request_is_in_flight_and_returns_once_it_is_answered(arch: str, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    with Server([model_path("Gate")], arch) as server:
        assert settle(server.url, deadline_s=5)  # idle
        held = threading.Thread(target=predict, args=(server, "gate", [{"gate": str(gate)}]))
        held.start()
        try:
            wait_for_file(gate.with_suffix(".started"))
            assert not settle(server.url, deadline_s=0.3)  # in flight: not settled by the deadline
        finally:
            gate.with_suffix(".release").touch()
            held.join(30)
        assert settle(server.url, deadline_s=30)


def test_settle_gives_up_on_what_is_not_a_twinserve_server() -> None:
    assert not settle("http://127.0.0.1:9", deadline_s=5)  # the discard port: nothing listens
