#!/usr/bin/env bash
# What worker threads buy: the same proxy binary with --threads 1 and with
# --threads N, in front of one redis-server, alternated round by round so
# that a change in the machine's load hits both alike. Each round runs
# redis-benchmark GET with 50 clients, without pipelining and 16 deep, and
# reports requests per second and the proxy's CPU (utime + stime from
# /proc/PID/stat) per request.
#
#   bash bench/scripts/threads_rates.sh [-n requests] [--rounds r] [--threads N]
#
# ACKPROXY_BIN overrides the binary (default target/release/ackproxy).
set -euo pipefail
cd "$(dirname "$0")/../.."
n=200000
rounds=3
threads=2
while [ $# -gt 0 ]; do
  case "$1" in
    -n) n="$2"; shift ;;
    --rounds) rounds="$2"; shift ;;
    --threads) threads="$2"; shift ;;
    *) echo "usage: $0 [-n requests] [--rounds r] [--threads N]" >&2; exit 2 ;;
  esac
  shift
done
bin=${ACKPROXY_BIN:-target/release/ackproxy}
out="bench/out/threads"
mkdir -p "$out"
source bench/scripts/lib.sh

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
  --daemonize no --dir "$out" >"$out/redis.log" 2>&1 &
pids+=($!)
wait_ping "$redis_port" "$!" redis

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

echo "| round | threads | test | rps | proxy CPU µs/request |"
echo "|---|---:|---|---:|---:|"
for r in $(seq "$rounds"); do
  for t in 1 "$threads"; do
    port=$(free_port)
    "$bin" --listen "127.0.0.1:$port" --upstream "127.0.0.1:$redis_port" --threads "$t" \
      >"$out/ackproxy.$t.log" 2>&1 &
    pid=$!
    pids+=("$pid")
    wait_ping "$port" "$pid" "ackproxy.$t"
    redis-benchmark -p "$port" -c 50 -n 20000 -t get -q >/dev/null 2>&1
    for p in 1 16; do
      before=$(ticks "$pid")
      rps=$(redis-benchmark -p "$port" -c 50 -n "$n" -t get -P "$p" --csv 2>/dev/null \
        | awk -F'"' '/GET/ {print $4}')
      after=$(ticks "$pid")
      awk -v r="$r" -v t="$t" -v p="$p" -v rps="$rps" -v d=$((after - before)) -v hz="$hz" -v n="$n" \
        'BEGIN { printf "| %d | %d | GET P%d | %.0f | %.2f |\n", r, t, p, rps, d / hz * 1e6 / n }'
    done
    kill "$pid"
    wait "$pid" 2>/dev/null || true
  done
done
