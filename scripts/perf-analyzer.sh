#!/usr/bin/env bash
# NVIDIA perf_analyzer against twinserve's Open Inference Protocol (V2) endpoint; the one place that installs it
# is src/twinserve/lab/perf_analyzer.py (pinned PyPI wheels, unpacked into <venv>/tools), which this runs.
#   scripts/perf-analyzer.sh install                                  unpack it if missing; print its path
#   scripts/perf-analyzer.sh measure http://127.0.0.1:8000 iris --concurrency 1,8 --duration 5
#   scripts/perf-analyzer.sh measure http://127.0.0.1:8000 iris --grpc 127.0.0.1:8001   over --grpc-port
#   scripts/perf-analyzer.sh -- -m iris -u 127.0.0.1:8000 -i http ...  perf_analyzer itself, any arguments
# It needs libb64-0d from Debian (scripts/system-deps.sh installs it). TWINSERVE_PYTHON picks the interpreter.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${TWINSERVE_PYTHON:-$root/.venv/bin/python}"
[ -x "$python" ] || python=python3
exec "$python" -m twinserve.lab.perf_analyzer "$@"
