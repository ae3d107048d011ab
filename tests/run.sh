#!/usr/bin/env bash
# The whole test suite: dependencies, unit and integration tests (each test
# starts its own redis-server processes), then a short benchmark run that
# checks every tool of bench/ works.
set -euo pipefail
cd "$(dirname "$0")/.."

bash tests/setup-deps.sh
export PATH="$PATH:/usr/sbin"
# Some tests hold 10,000 connections.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

cargo test --release -- --test-threads=2
bash bench/run.sh --smoke
