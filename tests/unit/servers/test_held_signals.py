"""A signal sent to a just-forked gunicorn worker waits for the worker's own handler (servers/sync/signals.py).

Each case runs in a fresh interpreter (the at-fork hooks stay registered for the life of the process that registers
them): it installs a handler as the arbiter's, forks, and in the child sends itself SIGTERM before installing the
worker's handler, as the arbiter's stop can reach a worker that has just been forked."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import os, signal, sys
from twinserve.servers.sync.signals import hold_across_forks, release

got = []
signal.signal(signal.SIGTERM, lambda *_: got.append("arbiter's"))  # what a worker inherits from its arbiter
if sys.argv[1] == "held":
    hold_across_forks()
pid = os.fork()
if pid == 0:
    os.kill(os.getpid(), signal.SIGTERM)  # the arbiter's SIGTERM, come before the worker's handler
    signal.signal(signal.SIGTERM, lambda *_: got.append("worker's"))  # gunicorn's Worker.init_signals
    release()
    print("child", got, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
os.kill(os.getpid(), signal.SIGTERM)  # the arbiter's own signals are never held
print("parent", got, flush=True)
"""


@pytest.mark.parametrize(
    ("mode", "child"),
    [
        ("held", 'child ["worker\'s"]'),  # delivered once the worker's handler is in place
        ("not held", 'child ["arbiter\'s"]'),  # as before: lost in the worker's copy of the arbiter
    ],
)
def test_a_sigterm_before_the_workers_handler_reaches_it(mode: str, child: str) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [child, 'parent ["arbiter\'s"]'], done.stdout + done.stderr


def test_a_fork_of_a_worker_holds_nothing() -> None:
    """The hooks are inherited by the arbiter's children; a fork made in a worker (a model's own) blocks nothing."""
    script = """
import os, signal
from twinserve.servers.sync.signals import HELD, hold_across_forks, release
hold_across_forks()
if os.fork() == 0:  # a worker
    release()
    if os.fork() == 0:  # the worker's own child
        print(sorted(HELD & signal.pthread_sigmask(signal.SIG_BLOCK, ())), flush=True)
        os._exit(0)
    os.wait()
    os._exit(0)
os.wait()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "[]\n"), done.stderr
