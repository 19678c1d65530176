#!/usr/bin/env bash
# System tools the test suite starts for real: redis-server (feature store of the I/O example), prometheus
# (a real scraper of /metrics) and its promtool (checks and unit-tests the alerting rules), wrk (a load driver),
# and libraries of tools they run. Installs whichever is missing, with apt-get, when run as root.
set -euo pipefail
has_library() {
    local cache
    cache="$(ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null || true)"
    grep -q "$1" <<<"$cache"
}
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
# Debian's prometheus package ships promtool too (tests/live/test_monitoring.py fails without it when CI=true).
{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || missing+=(prometheus)
command -v wrk >/dev/null 2>&1 || missing+=(wrk)  # `bench --driver wrk` in tests/live/lab/test_bench.py, benchmarks/
command -v chromium >/dev/null 2>&1 || missing+=(chromium)  # renders report.html in tests/live/lab/test_report.py
has_library 'libb64\.so\.0d' || missing+=(libb64-0d)  # NVIDIA perf_analyzer links it (scripts/perf-analyzer.sh)
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "missing: ${missing[*]} (Debian/Ubuntu: sudo apt-get install -y ${missing[*]})" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
