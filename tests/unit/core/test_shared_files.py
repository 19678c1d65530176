"""The files a server's processes share (core/shared.py `private_file`, repository/desired.py): in a folder only
the server's account may enter, each written through a file made anew, so that no other local account can make
one of their paths first and take it over (issue #44: the desired state was written through a fixed `<name>.tmp`
and left 0644, its lock too)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from twinserve.core import shared
from twinserve.repository import desired
from twinserve.repository.desired import DESIRED_STATE_ENV, DesiredState


def _mode(path: str | Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def state(monkeypatch: pytest.MonkeyPatch) -> Iterator[DesiredState]:
    monkeypatch.delenv(DESIRED_STATE_ENV, raising=False)
    path = desired.create()
    attached = DesiredState.attach()
    assert attached is not None and str(attached.path) == path
    yield attached


def test_a_shared_file_is_private_in_a_private_folder() -> None:
    fd, path = shared.private_file("twinserve-test-", ".json")
    os.close(fd)
    folder = os.path.dirname(path)
    assert _mode(folder) == 0o700 and _mode(path) == 0o600
    assert os.stat(folder).st_uid == os.getuid()
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        assert os.path.dirname(folder) == "/dev/shm"  # memory, not disk


#: Makes a shared file, forks a child that exits through the interpreter (running the atexit handlers it inherited,
#: as a gunicorn worker does), then says whether the file outlived the child.
FORKS = """
import os, sys
from twinserve.core.shared import private_file
fd, path = private_file("twinserve-test-")
print(path)
pid = os.fork()
if pid == 0:
    sys.exit(0)
os.waitpid(pid, 0)
print("kept" if os.path.exists(path) else "removed")
"""


def test_the_folder_outlives_a_forked_worker_and_goes_with_its_maker() -> None:
    run = subprocess.run([sys.executable, "-c", FORKS], capture_output=True, text=True, check=True, timeout=60)
    path, after_child = run.stdout.split()
    assert after_child == "kept"
    assert not os.path.exists(os.path.dirname(path))


def test_every_change_is_written_through_a_new_private_file(state: DesiredState) -> None:
    # Another account's file at the old fixed temporary path (here a link to a file of "theirs") is never used.
    planted = state.path.parent / "theirs.json"
    planted.write_text("theirs")
    state.path.with_suffix(".tmp").symlink_to(planted)
    generation = state.publish("iris", loaded=False)
    assert planted.read_text() == "theirs"
    assert [(c.model, c.loaded, c.generation) for c in DesiredState(state.path).pending()] == [
        ("iris", False, generation)
    ]
    assert _mode(state.path) == 0o600 and _mode(str(state.path) + ".lock") == 0o600
    assert _mode(state.path.parent) == 0o700
    left = {p.name for p in state.path.parent.iterdir()} - {state.path.name, state.path.name + ".lock"}
    assert left == {"theirs.json", state.path.with_suffix(".tmp").name}  # no temporary file of ours is left
