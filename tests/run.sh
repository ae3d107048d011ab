#!/usr/bin/env bash
# The whole test suite: dependencies, unit and integration tests (each test
# starts its own redis-server processes), then a short benchmark pass that
# checks every tool of bench/ works. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/sbin:/usr/local/sbin"

bash tests/setup-deps.sh
# The tests drive redis-cli and headless chromium; the benchmark pass at the
# end needs redis-benchmark, nutcracker and openssl.
bash tests/setup-bench-deps.sh
# The job frameworks tests/suite/frameworks.rs runs (rq, Celery, hotqueue,
# bee-queue, Bull, Sidekiq), at pinned versions.
bash tests/frameworks/setup.sh

# Some tests hold 10,000 client connections: raise the soft limit on open
# files to the hard one, and the hard one to 20,000 first where allowed.
hard=$(ulimit -Hn)
if [ "$hard" != unlimited ] && [ "$hard" -lt 20000 ]; then
  ulimit -Hn 20000 2>/dev/null || true
  hard=$(ulimit -Hn)
fi
if [ "$hard" = unlimited ]; then ulimit -Sn 1048576 2>/dev/null || true
else ulimit -Sn "$hard" 2>/dev/null || true; fi
if [ "$(ulimit -Sn)" != unlimited ] && [ "$(ulimit -Sn)" -lt 20000 ]; then
  echo "warning: ulimit -n is $(ulimit -Sn); tests with 10,000 connections may fail" >&2
fi

# Release build: some tests move 10 MB values and 100k-element replies, and
# the release build is also what bench/scripts/run.sh needs next.
cargo test --release -- --test-threads=2
# Tests written with redis-py, against the release build just made.
python3 tests/python/client_table.py --proxy "${CARGO_TARGET_DIR:-target}/release/ackproxy"
bash bench/scripts/run.sh --smoke
