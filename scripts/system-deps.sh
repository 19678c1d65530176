#!/usr/bin/env bash
# System tools the test suite starts for real: redis-server (feature store of the I/O example).
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "redis-server is missing: install it (Debian/Ubuntu: sudo apt-get install -y redis-server)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq redis-server >/dev/null
