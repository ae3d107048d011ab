#!/usr/bin/env bash
# Installs what the quick start needs: redis-server (the proxy's private
# upstream when none is configured; Debian's package brings redis-cli,
# which the examples of the README and docs/ use), from Debian's packages. The test
# suite's and the benchmarks' further tools come from
# tests/setup-bench-deps.sh, which tests/run.sh calls.
# Prints nothing and changes nothing when redis-server is present.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/usr/local/sbin"

command -v redis-server >/dev/null 2>&1 && exit 0

sudo=()
if [ "$(id -u)" -ne 0 ]; then sudo=(sudo env DEBIAN_FRONTEND=noninteractive); fi
echo "setup-deps: installing redis-server" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq </dev/null
"${sudo[@]}" apt-get install -y -qq --no-install-recommends redis-server </dev/null >/dev/null

command -v redis-server >/dev/null 2>&1 || { echo "setup-deps: redis-server still missing" >&2; exit 1; }
