"""How long `twinserve --help` and `twinserve serve --help` spend importing, from `python -X importtime`.

    python benchmarks/import_time.py [--python PATH] [--runs 7]

Prints, per command, the median over the runs of the summed cumulative time of the top-level imports, and the
five slowest top-level modules of the median run. Run it on a quiet machine; compare two installs by passing
each one's interpreter with --python.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys

COMMANDS = (["--help"], ["serve", "--help"], ["bench", "--help"])
_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


def top_level(stderr: str) -> dict[str, int]:
    """Cumulative microseconds of each module imported at the top level (not by another module)."""
    modules: dict[str, int] = {}
    for line in stderr.splitlines():
        match = _LINE.match(line)
        if match and len(match.group(3)) == 1:
            modules[match.group(4)] = int(match.group(2))
    return modules


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    for command in COMMANDS:
        runs = []
        for _ in range(args.runs):
            done = subprocess.run(
                [args.python, "-X", "importtime", "-m", "twinserve", *command],
                capture_output=True,
                text=True,
                check=True,
            )
            runs.append(top_level(done.stderr))
        totals = [sum(r.values()) for r in runs]
        median = statistics.median(totals)
        run = runs[totals.index(min(totals, key=lambda t: abs(t - median)))]
        slowest = sorted(run.items(), key=lambda kv: -kv[1])[:5]
        shown = ", ".join(f"{name} {us / 1000:.0f}" for name, us in slowest)
        print(f"twinserve {' '.join(command):<13} imports: median {median / 1000:6.0f} ms  ({shown} ms)")


if __name__ == "__main__":
    main()
