"""Resident memory per model, per architecture, for the built-in examples served from a model repository; and how
many copies of each model the machine holds (not run in CI).

    python benchmarks/repository_memory.py [--models tabular,tokens,embed] [--archs sync,async,hybrid] [--workers 1,2]
        [--versions 2]

For each architecture (sync, async, hybrid) and each `--workers` count, it starts a server over a repository that
holds one example model (`model.py` re-exporting the example class), sends it one request from the model's own
examples, and sums the resident memory (RSS) of the server's whole process tree: the server, its workers and, in
hybrid, the model-worker processes. The same server over a repository holding only a trivial model is the baseline.
A model's cost is the tree's RSS over that baseline; divided by the copies the machine holds of it, it is the cost of
one copy. Copies: one per server process in sync and async (each gunicorn or uvicorn worker loads every model), and
in hybrid one per model-worker process, `workers x model_workers x versions` (the server processes only import the
model). Hybrid runs again with `--versions` versions of each model, to show copies multiply.

RSS is not a timing: other jobs on the machine do not move it much. Shared pages (a forked gunicorn worker's, or
the libraries' code) count once per process here, as RSS does; the figures are what `ps` would show, summed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from twinserve.lab.servers import TwinserveServer

EXAMPLES = {
    "tabular": "twinserve.examples.tabular:Classifier",
    "tokens": "twinserve.examples.tokens:Tokens",
    "embed": "twinserve.examples.embed:MiniLM",
}
#: The baseline: a model that holds nothing and imports nothing.
NOOP = (
    "class Noop:\n    def predict(self, batch):\n        return batch\n\n    def examples(self):\n        return [1]\n"
)
MiB = 1 << 20


@dataclass
class Run:
    arch: str
    workers: int
    versions: int
    model: str
    tree_mib: float
    processes: int

    @property
    def copies(self) -> int:
        """Copies of the model the machine holds (model_workers is 1, its default with --arch hybrid)."""
        return self.workers * self.versions if self.arch == "hybrid" else self.workers


def write_repository(root: Path, name: str, versions: int) -> Path:
    """A repository holding `name` (an example, or the baseline's "noop") in `versions` version folders."""
    folder = root / name
    target = EXAMPLES.get(name)
    module, _, cls = (target or "noop:Noop").partition(":")
    source = NOOP if target is None else f"from {module} import {cls}\n"
    (folder).mkdir(parents=True)
    (folder / "twinserve.toml").write_text(f'model = "model.py:{cls}"\n')
    for version in range(1, versions + 1):
        (folder / str(version)).mkdir()
        (folder / str(version) / "model.py").write_text(source)
    return root


def answered_by(output: str) -> set[int]:
    """The server processes that answered a predict, from the access log lines of the server's output."""
    pids = set()
    for line in output.splitlines():
        if '"twinserve.access"' in line and ":predict" in line:
            with contextlib.suppress(ValueError, KeyError):
                pids.add(int(json.loads(line)["pid"]))
    return pids


def tree_rss(pid: int) -> tuple[int, int]:
    """(RSS bytes, processes) of a process and everything under it."""
    root = psutil.Process(pid)
    total, count = 0, 0
    for process in [root, *root.children(recursive=True)]:
        try:
            total += process.memory_info().rss
            count += 1
        except psutil.NoSuchProcess:
            continue
    return total, count


def measure(arch: str, workers: int, versions: int, name: str) -> Run:
    with tempfile.TemporaryDirectory(prefix="twinserve-memory-") as tmp:
        root = write_repository(Path(tmp), name, versions)
        flags = ("--model-repository", str(root), "--workers", str(workers))
        with TwinserveServer([], arch, *flags) as server:
            meta: dict[str, Any] = httpx.get(f"{server.url}/v1/models/{name}", timeout=60).json()
            body = {"instances": meta.get("examples", [])[:1] or [1]}
            # Until every server process has answered one (each loads its models before it accepts a connection):
            # a tree measured while one is still loading would count it short.
            for _ in range(workers * 200):
                answer = httpx.post(f"{server.url}/v1/models/{name}:predict", json=body, timeout=300)
                if answer.status_code != 200:
                    raise RuntimeError(f"{name} on {arch}: {answer.status_code} {answer.text[:200]}")
                if len(answered_by(server.output())) >= workers:
                    break
            else:
                raise RuntimeError(f"{name} on {arch}: fewer than {workers} server processes answered")
            rss, processes = tree_rss(server.pid)
    return Run(arch, workers, versions, name, rss / MiB, processes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tabular,tokens,embed", help="examples, of: " + ", ".join(EXAMPLES))
    parser.add_argument("--archs", default="sync,async,hybrid", help="architectures, comma-separated")
    parser.add_argument("--workers", default="1,2", help="server processes to try, comma-separated")
    parser.add_argument("--versions", type=int, default=2, help="versions per model in hybrid's extra runs")
    args = parser.parse_args()
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in EXAMPLES]
    if unknown:
        sys.exit(f"unknown example(s): {', '.join(unknown)}")
    archs = args.archs.split(",")
    plans = [(arch, int(w), 1) for arch in archs for w in args.workers.split(",")]
    if args.versions > 1 and "hybrid" in archs:
        plans += [("hybrid", int(w), args.versions) for w in args.workers.split(",")]
    head = "| arch | workers | versions | model | copies | processes | tree RSS MiB | over base MiB | per copy MiB |"
    print(head)
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|")
    for arch, workers, versions in plans:
        try:
            base = measure(arch, workers, versions, "noop")
        except Exception as exc:  # a server that did not start here (an overloaded machine): the next plan
            print(f"| {arch} | {workers} | {versions} | (baseline) | - | - | - | failed: {str(exc)[:80]} | - |")
            continue
        print(f"| {arch} | {workers} | {versions} | (baseline) | - | {base.processes} | {base.tree_mib:,.0f} | - | - |")
        for name in models:
            try:
                run = measure(arch, workers, versions, name)
            except Exception as exc:  # one example that cannot run here (a missing extra) does not stop the rest
                print(f"| {arch} | {workers} | {versions} | {name} | - | - | - | failed: {str(exc)[:80]} | - |")
                continue
            over = run.tree_mib - base.tree_mib
            row = f"| {arch} | {workers} | {versions} | {name} | {run.copies} | {run.processes} | {run.tree_mib:,.0f}"
            print(f"{row} | {over:,.0f} | {over / run.copies:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
