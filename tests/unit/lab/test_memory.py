"""Memory as the kernel counts it: PSS per process and role, and the verdict, advice and pod size that read it.

Before (2026-12-05): bench summed each process's RSS, which counts every page forked workers share once per
worker (sync 880 MiB against async 410 MiB for one model), named every process `server` (gunicorn's arbiter
among them, which holds no model) and judged S20 on that sum.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from tests.factory import level, results, run
from tests.serving import wait_until
from twinserve.config import Config
from twinserve.deploy.k8s_plan import MEMORY_HEADROOM, K8sPlan, sizing
from twinserve.lab.advise import AutoscalingTargets, advise
from twinserve.lab.options import Option
from twinserve.lab.probe import TreeSampler
from twinserve.lab.results import Level, ProcessMemory, Resources, Verdict
from twinserve.lab.verdicts import SOURCES, verdicts

#: A parent that holds SHARED_MIB of touched pages, then forks two children that keep them shared (copy on
#: write, never written): the shape of gunicorn's arbiter and its workers.
SHARED_MIB = 64
FORKED_TREE = textwrap.dedent(
    f"""
    import os, sys, time
    held = bytearray(b"x" * ({SHARED_MIB} * 1024 * 1024))
    children = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        children.append(pid)
    print(*children, flush=True)
    time.sleep(60)
    """
)


@pytest.fixture
def forked_tree() -> Iterator[tuple[int, list[int]]]:
    """A process tree (this test's own, stopped by PID): the root's pid and its two children's."""
    process = subprocess.Popen([sys.executable, "-c", FORKED_TREE], stdout=subprocess.PIPE, text=True)
    children: list[int] = []
    try:
        assert process.stdout is not None
        children += [int(pid) for pid in process.stdout.readline().split()]
        yield process.pid, children
    finally:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()
        for child in children:
            subprocess.run(["kill", "-9", str(child)], check=False, capture_output=True)


def _sampled(pid: int, roles: dict[int, str]) -> Resources:
    with TreeSampler(pid, interval=0.05, roles=roles, kernel_interval=0.05) as sampler:
        wait_until(lambda: len(sampler._rss) >= 3, timeout=30)
    return sampler.result()


def test_shared_pages_count_once_in_pss_and_every_process_has_its_role(forked_tree: tuple[int, list[int]]) -> None:
    root, children = forked_tree
    res = _sampled(root, {child: "server" for child in children})
    assert res.processes == 3
    assert res.pss_mib_max is not None
    # Summed RSS holds the shared pages three times, PSS once: the tree's PSS is above one copy of them, and
    # well below the RSS sum.
    assert res.rss_mib_max >= 3 * SHARED_MIB
    assert SHARED_MIB <= res.pss_mib_max < res.rss_mib_max - SHARED_MIB
    assert res.memory_mib == res.pss_mib_max and res.memory_basis == "PSS"
    roles = {p.pid: p.role for p in res.per_process}
    assert roles == {root: "supervisor", children[0]: "server", children[1]: "server"}
    assert all(p.pss_mib is not None and p.uss_mib is not None for p in res.per_process)
    assert list(res.by_role()) == ["supervisor", "server"]  # ROLES order
    assert res.by_role()["server"][0] == 2


def test_a_tree_that_names_no_roles_is_processes(forked_tree: tuple[int, list[int]]) -> None:
    """A peer (not twinserve) has no /metrics to say what its processes are: none is called a supervisor."""
    root, _ = forked_tree
    assert {p.role for p in _sampled(root, {}).per_process} == {"process"}


def _with_memory(lv: Level, per_process: list[ProcessMemory]) -> Level:
    rss = sum(p.rss_mib for p in per_process)
    pss = sum(p.pss_mib or 0.0 for p in per_process)
    assert lv.resources is not None
    resources = lv.resources.model_copy(
        update={
            "processes": len(per_process),
            "rss_mib_max": rss,
            "rss_mib_mean": rss,
            "pss_mib_max": pss,
            "per_process": per_process,
        }
    )
    return lv.model_copy(update={"resources": resources})


#: sync: an arbiter and two forked workers, whose model pages are shared: 630 MiB summed RSS, 270 MiB PSS.
SYNC_PROCESSES = [
    ProcessMemory(pid=1, role="supervisor", rss_mib=30, pss_mib=30),
    ProcessMemory(pid=2, role="server", rss_mib=300, pss_mib=120),
    ProcessMemory(pid=3, role="server", rss_mib=300, pss_mib=120),
]
ASYNC_PROCESSES = [ProcessMemory(pid=4, role="server", rss_mib=200, pss_mib=200)]


def _s20_memory(sync_processes: list[ProcessMemory], async_processes: list[ProcessMemory]) -> Verdict:
    sync = run("sync", "sync", [_with_memory(level(1, 500, 5), sync_processes)])
    asyn = run("async", "async", [_with_memory(level(1, 700, 4), async_processes)])
    return next(v for v in verdicts(results(sync, asyn)) if "memory" in v.claim)


def test_s20_memory_is_judged_on_pss_with_the_processes_by_role() -> None:
    """On summed RSS async would save 68% (630 vs 200 MiB: "holds"); the kernel holds 270 vs 200 MiB: 26%."""
    verdict = _s20_memory(SYNC_PROCESSES, ASYNC_PROCESSES)
    assert verdict.holds is False
    assert verdict.claimed == "~70% less" and verdict.measured == "26% less"
    assert "peak PSS of the whole server 200 MiB async vs 270 MiB sync" in verdict.evidence
    assert "less than claimed" in verdict.evidence
    assert "sync 1 supervisor 30 MiB, 2 server 240 MiB; async 1 server 200 MiB" in verdict.evidence


def test_s20_memory_falls_back_to_rss_for_results_without_pss() -> None:
    without = [p.model_copy(update={"pss_mib": None}) for p in SYNC_PROCESSES]
    sync = run("sync", "sync", [_with_memory(level(1, 500, 5), without)])
    sync.levels[0].resources.pss_mib_max = None  # type: ignore[union-attr]
    asyn = run("async", "async", [_with_memory(level(1, 700, 4), ASYNC_PROCESSES)])
    verdict = next(v for v in verdicts(results(sync, asyn)) if "memory" in v.claim)
    assert "peak RSS of the whole server 200 MiB async vs 630 MiB sync" in verdict.evidence
    assert verdict.holds is True


def test_the_latency_verdict_states_the_measured_magnitude_against_the_claimed_one() -> None:
    """Before: "5-10% lower latency: holds — 44% lower", with nothing saying 44% is far from 5-10%."""
    sync = run("sync", "sync", [level(1, 500, 10)])  # P50 5 ms
    asyn = run("async", "async", [level(1, 700, 5.6)])  # P50 2.8 ms: 44% lower
    verdict = next(v for v in verdicts(results(sync, asyn)) if "latency" in v.claim)
    assert verdict.holds is True
    assert (verdict.claimed, verdict.measured) == ("5-10% lower", "44% lower")
    assert "more than claimed" in verdict.evidence


def test_every_verdict_names_an_article_point_with_its_words() -> None:
    sync = run("sync", "sync", [level(1, 500, 10), level(8, 900, 30)])
    asyn = run("async", "async", [level(1, 700, 6), level(8, 2000, 12)])
    for verdict in verdicts(results(sync, asyn)):
        assert verdict.source in SOURCES, verdict


def test_advice_and_its_memory_cap_read_pss() -> None:
    """A 300 MiB cap: the sync server holds 270 MiB (PSS) though its processes' RSS sums to 630."""
    sync = run("sync", "sync", [_with_memory(level(4, 900, 20), SYNC_PROCESSES)])
    advice = advise(results(sync), 50, max_memory_mib=300)
    assert advice.meets and advice.choice is not None and advice.choice.run.label == "sync"
    assert "270 MiB PSS" in advice.choice.describe()


def test_the_pod_is_sized_on_pss_per_role_plus_the_supervisor() -> None:
    sync = run("sync", "sync", [_with_memory(level(4, 900, 20), SYNC_PROCESSES)])
    option = Option(sync, sync.levels[0])
    targets = AutoscalingTargets(arch="sync", basis=option, headroom=0.8, cpu_utilization_percent=60)
    config = Config(models=["twinserve.examples.tabular:Classifier"], arch="sync", workers=2)
    size = sizing(K8sPlan(config=config, image="x", targets=targets))
    expected = MEMORY_HEADROOM * (2 * 120 + 30)  # two workers at their PSS, one arbiter
    assert size.memory_mib == 64 * -(-expected // 64)
