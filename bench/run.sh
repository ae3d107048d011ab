#!/usr/bin/env bash
# Passthrough benchmark: direct Redis vs twemproxy (nutcracker, one server
# connection) vs ackproxy, measured in the same run with redis-benchmark,
# plus the proxy's memory with many idle client connections.
#
#   bash bench/run.sh            full run (what bench/RESULTS.md records)
#   bash bench/run.sh --smoke    a few thousand requests: checks every tool runs
#   bash bench/run.sh -n 200000  requests per measurement
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/sbin"

n=200000
idle=10000
rounds=2
smoke=0
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) smoke=1; n=5000; idle=500; rounds=1 ;;
    -n) n="$2"; shift ;;
    --idle) idle="$2"; shift ;;
    *) echo "usage: $0 [--smoke] [-n requests] [--idle connections]" >&2; exit 2 ;;
  esac
  shift
done

out="bench/out"
mkdir -p "$out"
cargo build --release --quiet --bin ackproxy
cargo bench --quiet --bench idle_conns --no-run 2>/dev/null
idle_bin=$(ls -t target/release/deps/idle_conns-* | grep -v '\.d$' | head -1)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

wait_ping() {
  for _ in $(seq 100); do
    [ "$(redis-cli -p "$1" ping 2>/dev/null)" = "PONG" ] && return 0
    sleep 0.05
  done
  echo "nothing answers on port $1" >&2
  exit 1
}

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
  >"$out/redis.log" 2>&1 &
pids+=($!)
wait_ping "$redis_port"

twem_port=$(free_port)
cat >"$out/nutcracker.yml" <<EOF
bench:
  listen: 127.0.0.1:$twem_port
  hash: fnv1a_64
  distribution: ketama
  redis: true
  server_connections: 1
  servers:
   - 127.0.0.1:$redis_port:1
EOF
nutcracker -c "$out/nutcracker.yml" -o "$out/nutcracker.log" -s "$(free_port)" &
pids+=($!)
wait_ping "$twem_port"

proxy_port=$(free_port)
RUST_LOG=warn target/release/ackproxy --listen "127.0.0.1:$proxy_port" \
  --upstream "127.0.0.1:$redis_port" >"$out/ackproxy.log" 2>&1 &
proxy_pid=$!
pids+=($proxy_pid)
wait_ping "$proxy_port"

declare -A rps p50 p99
measure() { # target port test pipeline
  local line
  line=$(redis-benchmark -p "$2" -c 50 -n "$n" -P "$4" -t "$3" -r 100000 --csv 2>/dev/null | tail -1)
  IFS=, read -r _ r _ _ q50 _ q99 _ <<<"${line//\"/}"
  [ -n "$r" ] || { echo "redis-benchmark failed against $1" >&2; exit 1; }
  local key="$1/$3/P$4"
  # Keep the best of the rounds: the machine is shared by all processes.
  if [ -z "${rps[$key]:-}" ] || awk "BEGIN{exit !($r > ${rps[$key]})}"; then
    rps[$key]=$r; p50[$key]=$q50; p99[$key]=$q99
  fi
}

tests=(set get lpush rpop)
for pipe in 1 16; do
  for t in "${tests[@]}"; do
    for _ in $(seq "$rounds"); do
      # Interleaved so that drift on the machine affects all three alike.
      measure direct "$redis_port" "$t" "$pipe"
      measure twemproxy "$twem_port" "$t" "$pipe"
      measure ackproxy "$proxy_port" "$t" "$pipe"
    done
  done
done

report="$out/report.txt"
{
  echo "requests per measurement: $n, clients: 50, best of $rounds rounds; cores: $(nproc)"
  printf '%-6s %-4s | %12s %7s %7s | %12s %7s %7s | %12s %7s %7s | %8s %8s\n' \
    test pipe direct p50 p99 twemproxy p50 p99 ackproxy p50 p99 "ack/dir" "ack/twem"
  for pipe in 1 16; do
    for t in "${tests[@]}"; do
      d="direct/$t/P$pipe"; w="twemproxy/$t/P$pipe"; a="ackproxy/$t/P$pipe"
      printf '%-6s P%-3s | %12s %7s %7s | %12s %7s %7s | %12s %7s %7s | %8s %8s\n' \
        "${t^^}" "$pipe" "${rps[$d]}" "${p50[$d]}" "${p99[$d]}" \
        "${rps[$w]}" "${p50[$w]}" "${p99[$w]}" "${rps[$a]}" "${p50[$a]}" "${p99[$a]}" \
        "$(awk "BEGIN{printf \"%.2f\", ${rps[$a]}/${rps[$d]}}")" \
        "$(awk "BEGIN{printf \"%.2f\", ${rps[$a]}/${rps[$w]}}")"
    done
  done
} | tee "$report"

# Memory with many idle clients: each connects, sends one PING, then idles.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
rss() { awk '/VmRSS/ {print $2}' "/proc/$proxy_pid/status"; }
before=$(rss)
"$idle_bin" "127.0.0.1:$proxy_port" "$idle" 3 >"$out/idle.log" 2>&1 &
idle_pid=$!
for _ in $(seq 600); do
  grep -q holding "$out/idle.log" 2>/dev/null && break
  kill -0 "$idle_pid" 2>/dev/null || break
  sleep 0.1
done
grep -q holding "$out/idle.log" || { cat "$out/idle.log" >&2; echo "idle connections failed" >&2; exit 1; }
during=$(rss)
wait "$idle_pid"
echo "ackproxy RSS: ${before} kB idle, ${during} kB with ${idle} idle clients connected" | tee -a "$report"
