"""The one server-process helper (`twinserve.lab.servers`) that tests, the lab and benchmarks/ start servers with."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from tests.conftest import ARCHS, CONTRACT_MODELS
from tests.serving import HTTP, ROOT
from twinserve.lab.servers import ServerFailed, ServerProcess, TwinserveServer, announced_url, free_port

TABULAR = "twinserve.examples.tabular:Classifier"


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def _still_running(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those of `processes` still running once a SIGKILL had time to land (a zombie is not running)."""
    _, alive = psutil.wait_procs(processes, timeout=10)
    return [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize("log_format", ["json", "console"])
def test_the_address_is_read_from_twinserve_s_own_start_up_line(log_format: str) -> None:
    """What `announce` writes, in either format, is what `announced_url` reads: the two cannot drift apart."""
    code = f"""
        from twinserve.config import load_config
        from twinserve.observability.logging import configure_logging
        from twinserve.servers import announce
        config = load_config(models=["{TABULAR}"], log_format="{log_format}")
        configure_logging(config.log_level, config.log_format)
        announce(config, 43210)
    """
    done = subprocess.run(python(code), capture_output=True, text=True, timeout=60, check=True)
    assert announced_url(done.stderr) == "http://127.0.0.1:43210"
    assert announced_url("twinserve: starting\n") is None


@pytest.mark.parametrize("arch", ARCHS)
def test_twinserve_binds_a_port_of_its_own_and_the_helper_reads_it(arch: str) -> None:
    """`--port 0` with two server processes (one socket handed to both) on every architecture: no port is picked
    beforehand, so none can be taken by another process in between."""
    workers = ("--workers", "2") if arch != "hybrid" else ("--model-workers", "1")
    with TwinserveServer([TABULAR], arch, *workers) as server:
        assert server.args[server.args.index("--port") + 1] == "0"
        assert server.port != 0
        assert announced_url(server.output()) == server.url == f"http://127.0.0.1:{server.port}"
        assert HTTP.get(server.url + "/v2/health/ready", timeout=30).status_code == 200
        tree = [psutil.Process(server.pid), *psutil.Process(server.pid).children(recursive=True)]
    assert server.process is not None and server.process.returncode == 0  # a graceful stop
    assert not _still_running(tree)


def test_a_server_that_exits_fails_loudly_with_what_it_printed() -> None:
    server = ServerProcess(python("import sys; print('bad model on purpose'); sys.exit(3)"), port=free_port())
    with pytest.raises(ServerFailed, match="exited with code 3") as failed:
        server.start()
    assert "bad model on purpose" in str(failed.value)
    assert server.output() == "bad model on purpose\n"  # kept after the temporary log went away


def test_a_server_never_ready_is_stopped_and_fails_loudly() -> None:
    """Nothing listens on the port: the readiness condition never holds, so the deadline passes."""
    code = "import time; print('loading forever', flush=True); time.sleep(600)"
    server = ServerProcess(python(code), port=free_port(), ready_timeout=1.0)
    with pytest.raises(ServerFailed, match="not ready after 1 s") as failed:
        server.start()
    assert "loading forever" in str(failed.value)
    assert server.process is not None and server.process.returncode is not None  # stopped, not left running


def test_stop_kills_a_server_that_ignores_sigterm_and_what_it_left_behind() -> None:
    """SIGTERM first, SIGKILL after the grace period, to the server's whole session (a worker it started too)."""
    code = """
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                                  "signal.SIG_IGN); time.sleep(600)"])
        print("worker", child.pid, flush=True)
        time.sleep(600)
    """
    server = ServerProcess(python(code), port=free_port(), ready=lambda s: "worker" in s.output(), grace=0.5)
    with server:
        worker = psutil.Process(int(server.output().split()[1]))
        assert worker.is_running()
    assert server.process is not None and server.process.returncode == -9
    assert not _still_running([worker])


def test_where_a_server_listens_is_known_once_it_said_so() -> None:
    server = TwinserveServer([TABULAR], "async")
    with pytest.raises(RuntimeError, match="start"):
        _ = server.url
    assert ServerProcess(["true"], port=8123).url == "http://127.0.0.1:8123"


def test_the_contract_table_script_serves_the_contract_suite_s_models() -> None:
    """scripts/contract_table.py names the models by file instead of importing the tests: the same list."""
    spec = importlib.util.spec_from_file_location("contract_table", ROOT / "scripts" / "contract_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.CONTRACT_MODELS == CONTRACT_MODELS
    assert module.ARCHS == ARCHS


def test_a_free_port_is_drawn_from_below_the_ephemeral_range() -> None:
    """Ports the kernel hands out for `bind(0)` and outgoing connections come from its ephemeral range; a port
    chosen for a server to bind later is taken from below it, so the server's own helpers cannot be given it."""
    low, _ = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = {free_port() for _ in range(5)}
    assert all(10000 <= port < low for port in ports)
    for port in ports:  # and each is free: it binds
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))
