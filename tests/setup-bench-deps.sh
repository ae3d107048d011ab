#!/usr/bin/env bash
# Installs what the test suite and the benchmarks need beyond the quick
# start (tests/setup-deps.sh): redis-tools (redis-cli, redis-benchmark),
# chromium with chromium-driver (tests/ops.rs drives the web view),
# nutcracker (twemproxy, the comparison in bench/) and openssl (the
# benchmark's TLS certificates), from Debian's packages.
# Prints nothing and changes nothing when all of them are present.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/usr/local/sbin"

missing=()
{ command -v redis-cli && command -v redis-benchmark; } >/dev/null 2>&1 || missing+=(redis-tools)
command -v nutcracker >/dev/null 2>&1 || missing+=(nutcracker)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=()
if [ "$(id -u)" -ne 0 ]; then sudo=(sudo env DEBIAN_FRONTEND=noninteractive); fi
echo "setup-bench-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq </dev/null
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null >/dev/null

for tool in redis-cli redis-benchmark nutcracker openssl chromium chromedriver; do
  command -v "$tool" >/dev/null 2>&1 || { echo "setup-bench-deps: $tool still missing" >&2; exit 1; }
done
