#!/usr/bin/env bash
# What a passthrough GET costs each process, Redis served directly against
# Redis behind ackproxy, in the same run: CPU µs per request of redis-server
# and of the proxy (utime+stime from /proc/<pid>/stat), split into user and
# system time, and TCP segments sent per request on this machine (OutSegs
# of /proc/net/snmp: every process's, so run it on an otherwise quiet
# machine). redis-benchmark is the load: 50 clients, one request in flight
# each (-P 1), or 16 (-P 16).
#
# Usage: bench/scripts/kernel_share.sh [N] [P]   (default 200000 requests, P 1)
# ACKPROXY_BIN overrides the binary (default target/release/ackproxy).
# Needs: redis-server, redis-benchmark, redis-cli.
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-200000}
depth=${2:-1}
bin=${ACKPROXY_BIN:-target/release/ackproxy}
out="bench/out/kernel_share"
mkdir -p "$out"
source bench/scripts/lib.sh

rport=$(free_port)
redis-server --port "$rport" --save '' --appendonly no >"$out/redis.log" 2>&1 &
rpid=$!
pids+=("$rpid")
wait_ping "$rport" "$rpid" redis
pport=$(free_port)
"$bin" --listen "127.0.0.1:$pport" --upstream "127.0.0.1:$rport" >"$out/proxy.log" 2>&1 &
ppid_=$!
pids+=("$ppid_")
wait_ping "$pport" "$ppid_" proxy

# utime and stime (clock ticks) of a process.
ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }
segments() { awk '/^Tcp:/ { if (seen) print $12; seen = 1 }' /proc/net/snmp; }
hz=$(getconf CLK_TCK)

echo "GET, 50 clients, -P $depth, $n requests; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-7s %10s %9s %18s %18s\n' via rps segs/req 'redis usr+sys µs' 'proxy usr+sys µs'
for via in direct proxy; do
  port=$rport
  [ "$via" = proxy ] && port=$pport
  redis-benchmark -p "$port" -c 50 -n 20000 -t get -P "$depth" -q >/dev/null
  read -r ru0 rs0 < <(ticks "$rpid")
  read -r pu0 ps0 < <(ticks "$ppid_")
  s0=$(segments)
  rps=$(redis-benchmark -p "$port" -c 50 -n "$n" -t get -P "$depth" -q | tr '\r' '\n' |
    awk '/requests per second/ { print $2 }' | tail -1)
  s1=$(segments)
  read -r ru1 rs1 < <(ticks "$rpid")
  read -r pu1 ps1 < <(ticks "$ppid_")
  awk -v n="$n" -v hz="$hz" -v via="$via" -v rps="$rps" -v s="$((s1 - s0))" \
    -v ru="$((ru1 - ru0))" -v rs="$((rs1 - rs0))" -v pu="$((pu1 - pu0))" -v ps="$((ps1 - ps0))" \
    'BEGIN { f = 1e6 / hz / n;
             printf "%-7s %10s %9.2f %8.2f+%-9.2f %8.2f+%-9.2f\n", via, rps, s / n,
                    ru * f, rs * f, pu * f, ps * f }'
done
