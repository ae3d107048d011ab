#!/usr/bin/env bash
# ackproxy in front of a Redis Cluster: one primary against three, on one
# machine, beside a plain redis-server. No replicas.
#
# Passthrough, redis-benchmark -c 50 -r 100000 SET and GET, without
# pipelining and 16 deep, against:
#   direct         the plain redis-server itself
#   proxy-direct   ackproxy (upstream_mode direct) on that redis-server
#   proxy-c1       ackproxy (upstream_mode cluster) on the 1-primary cluster
#   proxy-c3       ackproxy (upstream_mode cluster) on the 3-primary cluster
#   bench-c3       redis-benchmark --cluster straight on the 3-primary
#                  cluster: what a cluster-aware client gets (it runs
#                  one thread per primary, 3 here, where the others run
#                  one: compare its CPU per request, not its rate)
# Queue pairs (bench/pairs.rs's generator, rpop mode: RPOP + ACK, one
# request in flight per connection) through proxy-direct, proxy-c1 and
# proxy-c3, on the same queues in each: two per primary of the 3-primary
# cluster (rule pattern "q*", ack_id "json:id"), the connections spread
# over them and the messages in proportion.
#
# Every measurement reports the rate and the CPU time (utime + stime, from
# /proc/PID/stat for the servers, from the shell's `time` for the client)
# of each process per request (per pair for queues): each Redis node, the
# proxy, the client. The servers all share the machine's cores with the
# proxy and the client, so a rate says nothing about scaling out; the CPU
# per request is the figure that carries over. Rounds alternate the
# targets so that a change in the machine's load hits all alike; tables
# show per-target medians, with the 1-minute load average around each run.
#
#   bash bench/scripts/cluster.sh [-n requests] [--pipelined-n requests] [--rounds r]
#                         [--messages m] [--queues q] [--conns c]
#
# Builds with `cargo build --release` and `cargo bench --bench pairs
# --no-run` (the generator); ACKPROXY_BIN overrides the proxy binary. Every
# process it starts is stopped on exit. Output: bench/out/cluster/.
set -euo pipefail
cd "$(dirname "$0")/../.."

n=100000
np=500000
rounds=3
messages=120000
queues=6
conns=50
while [ $# -gt 0 ]; do
  case "$1" in
    -n) n="$2"; shift ;;
    --pipelined-n) np="$2"; shift ;;
    --rounds) rounds="$2"; shift ;;
    --messages) messages="$2"; shift ;;
    --queues) queues="$2"; shift ;;
    --conns) conns="$2"; shift ;;
    *) echo "usage: $0 [-n requests] [--pipelined-n requests] [--rounds r] [--messages m] [--queues q] [--conns c]" >&2; exit 2 ;;
  esac
  shift
done
[ $((queues % 3)) -eq 0 ] || { echo "--queues must be a multiple of 3 (as many on each primary)" >&2; exit 2; }
for tool in redis-server redis-cli redis-benchmark; do
  command -v "$tool" >/dev/null || { echo "$tool not found" >&2; exit 1; }
done

out="bench/out/cluster"
rm -rf "$out"
mkdir -p "$out"
source bench/scripts/lib.sh

# Paths from cargo, so that CARGO_TARGET_DIR is respected.
exe() { grep -o '"executable":"[^"]*"' | cut -d'"' -f4 | grep "$1" | head -1; }
if [ -n "${ACKPROXY_BIN:-}" ]; then
  proxy_bin=$ACKPROXY_BIN
else
  proxy_bin=$(cargo build --release --quiet --message-format=json-render-diagnostics | exe '/ackproxy$')
fi
gen_bin=$(cargo bench --quiet --bench pairs --no-run --message-format=json-render-diagnostics \
  | exe '/pairs-[^/]*$')
[ -x "$proxy_bin" ] && [ -x "$gen_bin" ] || { echo "build produced no binaries" >&2; exit 1; }

# A port whose cluster bus port (+10000) is free too; free_port stays below
# 32000, so both are below 55000.
cluster_port() {
  local p
  while :; do
    p=$(free_port)
    (exec 3<>"/dev/tcp/127.0.0.1/$((p + 10000))") 2>/dev/null || { echo "$p"; return; }
  done
}

start_redis() { # name port [options]: the pid
  local name=$1 port=$2
  shift 2
  mkdir -p "$out/$name"
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
    --daemonize no --dir "$out/$name" "$@" >"$out/$name.log" 2>&1 &
  echo $!
}

start_node() { # name: its port and pid in $node_port, $node_pid
  node_port=$(cluster_port)
  node_pid=$(start_redis "$1" "$node_port" --cluster-enabled yes \
    --cluster-config-file "$PWD/$out/$1/nodes.conf")
  pids+=("$node_pid")
  wait_ping "$node_port" "$node_pid" "$1"
}

wait_cluster() { # name port...: every node says ok and knows them all
  local name=$1
  shift
  for _ in $(seq 600); do
    local ok=1
    for p in "$@"; do
      local info
      info=$(redis-cli -p "$p" CLUSTER INFO 2>/dev/null | tr -d '\r')
      grep -q '^cluster_state:ok$' <<<"$info" && grep -q "^cluster_known_nodes:$#$" <<<"$info" \
        || { ok=0; break; }
    done
    [ "$ok" = 1 ] && return 0
    sleep 0.1
  done
  echo "$name did not reach cluster_state:ok" >&2
  exit 1
}

plain_port=$(free_port)
plain_pid=$(start_redis plain "$plain_port")
pids+=("$plain_pid")
wait_ping "$plain_port" "$plain_pid" plain

# `redis-cli --cluster create` wants three primaries at least: the
# 1-primary cluster is one node given every slot.
start_node c1-a
c1_ports=("$node_port"); c1_pids=("$node_pid")
[ "$(redis-cli -p "$node_port" CLUSTER ADDSLOTSRANGE 0 16383)" = OK ] \
  || { echo "CLUSTER ADDSLOTSRANGE failed" >&2; exit 1; }
wait_cluster c1 "${c1_ports[@]}"

c3_ports=(); c3_pids=()
for x in a b c; do
  start_node "c3-$x"
  c3_ports+=("$node_port"); c3_pids+=("$node_pid")
done
redis-cli --cluster create "${c3_ports[@]/#/127.0.0.1:}" --cluster-yes \
  >"$out/cluster-create.log" 2>&1 || { cat "$out/cluster-create.log" >&2; exit 1; }
wait_cluster c3 "${c3_ports[@]}"

cat >"$out/ackproxy.toml" <<'EOF'
[[queue]]
pattern = "q*"
ack_id = "json:id"
EOF
start_proxy() { # name upstream-mode seeds: its port and pid in $proxy_port, $proxy_pid
  proxy_port=$(free_port)
  RUST_LOG=warn "$proxy_bin" --listen "127.0.0.1:$proxy_port" --upstream-mode "$2" \
    --upstream "$3" --config "$out/ackproxy.toml" >"$out/$1.log" 2>&1 &
  proxy_pid=$!
  pids+=("$proxy_pid")
  wait_ping "$proxy_port" "$proxy_pid" "$1"
}
start_proxy proxy-direct direct "127.0.0.1:$plain_port"
pd_port=$proxy_port; pd_pid=$proxy_pid
start_proxy proxy-c1 cluster "127.0.0.1:${c1_ports[0]}"
p1_port=$proxy_port; p1_pid=$proxy_pid
# One seed: the proxy learns the other nodes from it (a comma-separated
# list of seeds is refused by this version's upstream check).
start_proxy proxy-c3 cluster "127.0.0.1:${c3_ports[0]}"
p3_port=$proxy_port; p3_pid=$proxy_pid

# Per target: where the client connects, the proxy's pid (- for none), the
# Redis nodes' pids and ports, and extra redis-benchmark options.
declare -A port_of=([direct]=$plain_port [proxy-direct]=$pd_port [proxy-c1]=$p1_port
  [proxy-c3]=$p3_port [bench-c3]=${c3_ports[0]})
declare -A proxy_of=([direct]=- [proxy-direct]=$pd_pid [proxy-c1]=$p1_pid [proxy-c3]=$p3_pid
  [bench-c3]=-)
declare -A nodes_of=([direct]=$plain_pid [proxy-direct]=$plain_pid [proxy-c1]="${c1_pids[*]}"
  [proxy-c3]="${c3_pids[*]}" [bench-c3]="${c3_pids[*]}")
declare -A node_ports_of=([proxy-direct]=$plain_port [proxy-c1]="${c1_ports[*]}"
  [proxy-c3]="${c3_ports[*]}")
declare -A opts_of=([bench-c3]=--cluster)

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
load1() { cut -d' ' -f1 /proc/loadavg; }
per() { awk -v d="$1" -v n="$2" 'BEGIN { printf "%.2f", (n > 0 ? d / n : 0) }'; }

# One measured run of a client command: fills $client_us (the client's
# user + system CPU, µs), $proxy_ticks, $node_ticks (space-separated, in
# the order of nodes_of), $load_b, $load_a. The command's stdout goes to
# $out/last.out.
measured() { # target command...
  local target=$1 TIMEFORMAT='%3U %3S' t p0 n0=() p
  shift
  local proxy=${proxy_of[$target]} nodes=(${nodes_of[$target]})
  load_b=$(load1)
  [ "$proxy" = - ] || p0=$(ticks "$proxy")
  for p in "${nodes[@]}"; do n0+=("$(ticks "$p")"); done
  t=$( { time "$@" >"$out/last.out" 2>>"$out/clients.err"; } 2>&1 ) \
    || { echo "client failed against $target: $*; see $out/clients.err" >&2; exit 1; }
  node_ticks=""
  for i in "${!nodes[@]}"; do node_ticks+="$(( $(ticks "${nodes[$i]}") - n0[i] )) "; done
  proxy_ticks=-
  [ "$proxy" = - ] || proxy_ticks=$(( $(ticks "$proxy") - p0 ))
  load_a=$(load1)
  client_us=$(awk -v u="${t% *}" -v s="${t#* }" 'BEGIN { printf "%.0f", (u + s) * 1e6 }')
}

# Results, one line per run: target test pipe rate count client_us
# proxy_ticks load_b load_a node_ticks...
runs="$out/runs.txt"
: >"$runs"
record() { # target test pipe rate count
  echo "$1 $2 $3 $4 $5 $client_us $proxy_ticks $load_b $load_a $node_ticks" >>"$runs"
  printf '%-13s %-5s P%-3s %10.0f/s  client %s µs, proxy %s ticks, nodes %s ticks, load %s→%s\n' \
    "$1" "$2" "$3" "$4" "$client_us" "$proxy_ticks" "$node_ticks" "$load_b" "$load_a" >&2
}

bench_once() { # target test pipe requests
  local target=$1 t=$2 pipe=$3 count=$4 rps
  # shellcheck disable=SC2086
  measured "$target" redis-benchmark -h 127.0.0.1 -p "${port_of[$target]}" -c 50 -n "$count" \
    -P "$pipe" -t "$t" -r 100000 --csv ${opts_of[$target]:-}
  rps=$(awk -F'"' -v t="${t^^}" '$2 == t { print $4 }' "$out/last.out")
  [[ "$rps" =~ ^[0-9.]+$ ]] || { echo "no rate from redis-benchmark against $target" >&2; exit 1; }
  record "$target" "${t^^}" "$pipe" "$rps" "$count"
}

# The queues: the first names q0, q1, … that put queues/3 on each primary
# of the 3-primary cluster, each with its owner there.
slot_owner() { # slot: the port of the c3 node serving it
  redis-cli -p "${c3_ports[0]}" CLUSTER NODES | awk -v s="$1" '
    { split($2, a, "[:@]")
      for (i = 9; i <= NF; i++) { split($i, r, "-"); if (r[2] == "") r[2] = r[1]
        if (s >= r[1] + 0 && s <= r[2] + 0) print a[2] } }'
}
qnames=(); declare -A c3_owner taken
for ((i = 0; ${#qnames[@]} < queues; i++)); do
  q="q$i"
  o=$(slot_owner "$(redis-cli -p "${c3_ports[0]}" CLUSTER KEYSLOT "$q")")
  [ "${taken[$o]:-0}" -lt $((queues / 3)) ] || continue
  taken[$o]=$(( ${taken[$o]:-0} + 1 ))
  qnames+=("$q"); c3_owner[$q]=$o
done
qlist=$(IFS=,; echo "${qnames[*]}")
# Connection j works on queue j mod queues: each queue gets messages in
# proportion to its connections, so that all drain together.
declare -A share
left=$messages
for i in "${!qnames[@]}"; do
  c=$(( conns / queues + (i < conns % queues ? 1 : 0) ))
  share[${qnames[$i]}]=$(( messages * c / conns ))
  left=$(( left - share[${qnames[$i]}] ))
done
share[${qnames[0]}]=$(( share[${qnames[0]}] + left ))
echo "queues (owner port on the 3-primary cluster: messages): $(for q in "${qnames[@]}"; do
  printf '%s (%s: %s) ' "$q" "${c3_owner[$q]}" "${share[$q]}"; done)" >&2

owner() { # target queue
  case $1 in
    proxy-c3) echo "${c3_owner[$2]}" ;;
    *) echo "${node_ports_of[$1]}" ;;
  esac
}

# 128-byte messages as bench/pairs.rs makes them, ids unique over the
# queues, LPUSHed 1000 at a time straight on the queue's node.
prefill() { # target
  local first=0 q p r
  for p in ${node_ports_of[$1]}; do
    [ "$(redis-cli -p "$p" FLUSHALL)" = OK ] || { echo "FLUSHALL failed on $p" >&2; exit 1; }
  done
  for q in "${qnames[@]}"; do
    p=$(owner "$1" "$q")
    r=$(awk -v q="$q" -v first="$first" -v n="${share[$q]}" 'BEGIN {
        pad = sprintf("%97s", ""); gsub(/ /, "x", pad)
        for (i = 0; i < n; i += 1000) {
          k = (n - i < 1000) ? n - i : 1000
          printf "*%d\r\n$5\r\nLPUSH\r\n$%d\r\n%s\r\n", k + 2, length(q), q
          for (j = i; j < i + k; j++)
            printf "$128\r\n{\"id\":\"%012d\",\"body\":\"%s\"}\r\n", first + j, pad
        } }' | redis-cli -p "$p" --pipe 2>&1)
    grep -q 'errors: 0' <<<"$r" || { echo "prefill of $q failed: $r" >&2; exit 1; }
    first=$(( first + share[$q] ))
  done
}

# What the run left: ready or leased messages, or pops not acknowledged.
leftovers() { # target
  local q sum=0 info v
  for q in "${qnames[@]}"; do
    info=$(redis-cli -p "${port_of[$1]}" QUEUE INFO "$q" | paste - -)
    v=$(awk '$1 == "ready" || $1 == "leased" || $1 == "deliveries" { s += $2 }
      $1 == "acks" { s -= $2 } END { print s + 0 }' <<<"$info")
    sum=$(( sum + v + $(redis-cli -p "$(owner "$1" "$q")" LLEN "$q") ))
  done
  echo "$sum"
}

pairs_once() { # target
  local target=$1 g pairs fails secs left
  prefill "$target"
  measured "$target" "$gen_bin" --generate rpop "${port_of[$target]}" "$conns" "$qlist"
  g=$(cat "$out/last.out")
  pairs=$(grep -o 'pairs=[0-9]*' <<<"$g" | cut -d= -f2)
  fails=$(grep -o 'failures=[0-9]*' <<<"$g" | cut -d= -f2)
  secs=$(grep -o 'elapsed_s=[0-9.]*' <<<"$g" | cut -d= -f2)
  left=$(leftovers "$target")
  if [ "$pairs" != "$messages" ] || [ "$fails" != 0 ] || [ "$left" != 0 ]; then
    echo "$target: $pairs pairs of $messages, $fails failures, $left left over ($g)" >&2
    exit 1
  fi
  record "$target" PAIRS 1 "$(awk -v p="$pairs" -v s="$secs" 'BEGIN { print p / s }')" "$pairs"
}

load_start=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date -u '+%Y-%m-%d %H:%M UTC')
targets=(direct proxy-direct proxy-c1 proxy-c3 bench-c3)
# A first pass fills the keys the GETs read and warms every connection.
for target in "${targets[@]}"; do
  # shellcheck disable=SC2086
  redis-benchmark -h 127.0.0.1 -p "${port_of[$target]}" -c 50 -n 200000 -t set -r 100000 -q \
    ${opts_of[$target]:-} >/dev/null 2>>"$out/clients.err"
done
for r in $(seq "$rounds"); do
  echo "round $r" >&2
  for pipe in 1 16; do
    count=$n
    [ "$pipe" = 1 ] || count=$np
    for t in set get; do
      for target in "${targets[@]}"; do bench_once "$target" "$t" "$pipe" "$count"; done
    done
  done
  for target in proxy-direct proxy-c1 proxy-c3; do pairs_once "$target"; done
done
for p in "${pids[@]}"; do alive "$p" "process $p"; done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 }
  END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# Medians over the rounds of one target, test and pipeline: a table row.
row() { # target test pipe
  local sel col k vals i nn
  sel=$(awk -v a="$1" -v b="$2" -v c="$3" '$1 == a && $2 == b && $3 == c' "$runs")
  [ -n "$sel" ] || return 0
  col() { awk -v k="$1" '{ print $k }' <<<"$sel" | median; }
  local rate count client proxy lb la nodes=() sum
  rate=$(col 4); count=$(col 5)
  client=$(per "$(col 6)" "$count")
  if [ "$(awk '{ print $7; exit }' <<<"$sel")" = - ]; then proxy=-; else proxy=$(per "$(col 7 | awk -v h="$hz" '{ print $1 * 1e6 / h }')" "$count"); fi
  nn=$(awk '{ print NF - 9; exit }' <<<"$sel")
  sum=0
  for ((i = 10; i < 10 + nn; i++)); do
    nodes+=("$(per "$(col "$i" | awk -v h="$hz" '{ print $1 * 1e6 / h }')" "$count")")
    sum=$(awk -v s="$sum" -v x="${nodes[-1]}" 'BEGIN { print s + x }')
  done
  local all
  all=$(awk -v a="$client" -v b="$proxy" -v c="$sum" 'BEGIN { printf "%.1f", a + (b == "-" ? 0 : b) + c }')
  lb=$(awk '{ print $8 }' <<<"$sel" | tr '\n' ' '); la=$(awk '{ print $9 }' <<<"$sel" | tr '\n' ' ')
  printf '| %s | %s | %s | %.0f | %s | %s | %s | %.2f | %s | %s→%s |\n' "$1" "$2" \
    "$3" "$rate" "$client" "$proxy" \
    "$(IFS=/; echo "${nodes[*]}" | sed 's|/| / |g')" "$sum" "$all" "$(median <<<"$lb")" "$(median <<<"$la")"
}

report="$out/report.md"
{
  echo "Started $started; $(nproc) cores; $(redis-server --version | cut -d' ' -f1-3)."
  echo "Load average (1, 5, 15 min) at the start: $load_start; at the end: $load_end."
  echo "Medians of $rounds round(s). CPU: µs per request (per pair for PAIRS) of each process,"
  echo "utime + stime; Redis nodes in the order of their ports; load: the 1-minute load average"
  echo "just before → just after the run (medians)."
  echo
  echo "| target | test | pipeline | requests/s | client CPU | proxy CPU | Redis CPU per node | Redis CPU sum | all | load |"
  echo "|---|---|---:|---:|---:|---:|---|---:|---:|---|"
  for pipe in 1 16; do
    for t in SET GET; do
      for target in "${targets[@]}"; do row "$target" "$t" "$pipe"; done
    done
  done
  echo
  echo "Queue pairs: ${#qnames[@]} queues ($qlist; two per primary of the 3-primary cluster),"
  echo "$messages messages of 128 B per run, $conns connections (connection j on queue j mod ${#qnames[@]})."
  echo
  echo "| target | test | pipeline | pairs/s | generator CPU | proxy CPU | Redis CPU per node | Redis CPU sum | all | load |"
  echo "|---|---|---:|---:|---:|---:|---|---:|---:|---|"
  for target in proxy-direct proxy-c1 proxy-c3; do row "$target" PAIRS 1; done
} >"$report"
cat "$report"
