#!/usr/bin/env bash
# What recording metrics costs the proxy, in instructions per request: the
# same fixed request stream (redis-benchmark GET and SET, no pipelining; and
# queue pairs, LPUSH + RPOP leased + ACK from one redis-cli) through ackproxy
# under callgrind, once without and once with --metrics.
# Instruction counts do not move with the machine's load, unlike rates and
# CPU time, so a difference of 1% is visible. Start-up is left out: the
# counters are zeroed after a warm-up and dumped after the measured stream.
#
#   bash bench/scripts/metrics_instructions.sh            20,000 requests per test
#                                                 (a quarter as many pairs)
#   bash bench/scripts/metrics_instructions.sh -n 50000
#
# Output: a table on stdout and bench/out/metrics-instructions/.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PATH:/usr/sbin:/usr/local/sbin"

n=20000
while [ $# -gt 0 ]; do
  case "$1" in
    -n) n="$2"; shift ;;
    *) echo "usage: $0 [-n requests]" >&2; exit 2 ;;
  esac
  shift
done
for tool in redis-server redis-cli redis-benchmark valgrind callgrind_control; do
  command -v "$tool" >/dev/null || { echo "$tool not found (valgrind: apt-get install valgrind)" >&2; exit 1; }
done

out="bench/out/metrics-instructions"
mkdir -p "$out"
cargo build --release --quiet
bin=target/release/ackproxy

source bench/scripts/lib.sh

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
  --daemonize no --dir "$out" >"$out/redis.log" 2>&1 &
pids+=($!)
wait_ping "$redis_port" "$!" redis

cat >"$out/queue.toml" <<'TOML'
[[queue]]
pattern = "q"
ack_id = "payload"
lease_ms = 600000
TOML

# `count` pop+ACK pairs from one client, one request at a time.
pairs() { # port count first
  local port=$1 count=$2 first=$3
  awk -v n="$count" -v f="$first" 'BEGIN {
    for (i = f; i < f + n; i++) printf "LPUSH q m%d\nRPOP q\nACK q m%d\n", i, i
  }' | redis-cli -p "$port" >/dev/null
}

# The load of test `t` (get, set or pairs): `count` requests or pairs.
load() { # port t count first
  if [ "$2" = pairs ]; then
    pairs "$1" "$3" "$4"
  else
    redis-benchmark -p "$1" -c 10 -n "$3" -t "$2" -r 1000 -q >/dev/null 2>&1
  fi
}

# Instructions the proxy executes for one redis-benchmark run of `test`.
measure() { # mode test [proxy flags]
  local mode=$1 t=$2 port pid file
  shift 2
  port=$(free_port)
  file="$out/callgrind.$mode.$t"
  rm -f "$file"*
  valgrind --tool=callgrind --callgrind-out-file="$file" \
    "$bin" --listen "127.0.0.1:$port" --upstream "127.0.0.1:$redis_port" \
    --config "$out/queue.toml" "$@" \
    >"$out/ackproxy.$mode.$t.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  # Slow to start under callgrind: up to 60 s.
  wait_ping "$port" "$pid" "ackproxy.$mode.$t" 1200
  load "$port" "$t" "$(count "$t" 2000)" 0
  callgrind_control -z "$pid" >/dev/null 2>&1
  load "$port" "$t" "$(count "$t" "$n")" 1000000
  callgrind_control -d "$pid" >/dev/null 2>&1
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  # The dump made after zeroing holds the measured stream alone.
  local dump
  dump=$(ls -t "$file".* 2>/dev/null | head -1)
  awk '/^(summary|totals):/ {print $2; exit}' "$dump"
}

# Requests of test `t` for a stream of `n`: pairs are a quarter as many.
count() { # t n
  if [ "$1" = pairs ]; then echo $(($2 / 4)); else echo "$2"; fi
}

printf '%-5s | %14s | %14s | %8s | %8s | %6s\n' test "Ir off" "Ir on" "off/each" "on/each" on/off
for t in get set pairs; do
  off=$(measure off "$t")
  on=$(measure on "$t" --metrics "127.0.0.1:$(free_port)")
  awk -v t="$t" -v off="$off" -v on="$on" -v n="$(count "$t" "$n")" 'BEGIN {
    printf "%-5s | %14d | %14d | %8.0f | %8.0f | %6.3f\n", toupper(t), off, on, off / n, on / n, on / off
  }'
done
