#!/usr/bin/env bash
# Installs what the test suite and the benchmarks need beyond the quick
# start (tests/setup-deps.sh): redis-tools (redis-cli, redis-benchmark),
# chromium with chromium-driver (tests/suite/ops.rs drives the web view),
# nutcracker (twemproxy, the comparison in bench/), openssl (the
# benchmark's TLS certificates) and prometheus (its promtool checks the
# metrics exposition in tests/suite/metrics.rs), from Debian's packages; and, where node
# and npm are installed, the Redis clients of tests/node (node-redis,
# ioredis: tests/suite/node_clients.rs) with `npm ci` from its lock file, and
# redis-py 8 with pip. Without node (or pip) those tests skip, and this
# says so.
# Prints nothing and changes nothing when all of them are present.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/usr/local/sbin"

node_clients() {
  local dir
  dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/node"
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "setup-bench-deps: node or npm not found: tests/suite/node_clients.rs will skip (install Node.js 20 or later)" >&2
    return 0
  fi
  # npm ci records what it installed in node_modules/.package-lock.json:
  # installed already unless the lock file changed since.
  [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ] || return 0
  echo "setup-bench-deps: installing tests/node (npm ci)" >&2
  npm ci --prefix "$dir" --no-audit --no-fund --loglevel=error >/dev/null
}
node_clients

# redis-py 8, which tests/suite/client_metadata.rs, tests/suite/queue.rs and
# tests/python/ drive as a real client (they skip, saying so, without it).
python_client() {
  python3 -c 'import redis, sys; sys.exit(int(redis.__version__.split(".")[0]) < 8)' 2>/dev/null && return 0
  echo "setup-bench-deps: installing redis-py 8 (pip)" >&2
  python3 -m pip install --quiet --disable-pip-version-check 'redis>=8,<9' >/dev/null ||
    echo "setup-bench-deps: could not install redis-py: its tests will skip" >&2
}
python_client

# cargo-deb, which packaging/deb.sh uses to make the Debian package that
# tests/suite/packaging.rs builds and installs.
command -v cargo-deb >/dev/null 2>&1 || {
  echo "setup-bench-deps: installing cargo-deb 3.8.0 (cargo install)" >&2
  cargo install --quiet --locked cargo-deb --version 3.8.0
}

missing=()
{ command -v redis-cli && command -v redis-benchmark; } >/dev/null 2>&1 || missing+=(redis-tools)
command -v nutcracker >/dev/null 2>&1 || missing+=(nutcracker)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=()
if [ "$(id -u)" -ne 0 ]; then sudo=(sudo env DEBIAN_FRONTEND=noninteractive); fi
echo "setup-bench-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq </dev/null
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null >/dev/null

for tool in redis-cli redis-benchmark nutcracker openssl chromium chromedriver promtool; do
  command -v "$tool" >/dev/null 2>&1 || { echo "setup-bench-deps: $tool still missing" >&2; exit 1; }
done
