#!/usr/bin/env bash
# Passthrough benchmark: direct Redis vs twemproxy (nutcracker, one server
# connection) vs ackproxy, measured in the same run with redis-benchmark;
# direct Redis and ackproxy again with every client logged in as the ACL
# user `bench` (all rights; redis-benchmark --user bench -a ...), which
# through ackproxy share that user's connection; then the same over TLS:
# Redis's own TLS port vs ackproxy's TLS listener (upstream plain, and
# upstream TLS too); last the proxy's memory with many idle client
# connections.
#
#   bash bench/scripts/run.sh            full run (what bench/RESULTS.md records)
#   bash bench/scripts/run.sh --smoke    a few thousand requests, 500 idle clients:
#                                checks that every tool runs, asserts no ratio
#   bash bench/scripts/run.sh -n 200000 --idle 10000 --rounds 2
#   bash bench/scripts/run.sh --baseline /path/to/older/ackproxy
#                                also measures that binary, interleaved,
#                                for a before/after comparison in one run
#   bash bench/scripts/run.sh --tests lpush,set   only these redis-benchmark tests
#                                (TLS: set and get as always)
#   bash bench/scripts/run.sh --latency 5  also measures the latency ackproxy adds:
#                                GET from 10 clients without pipelining,
#                                direct, twemproxy and ackproxy interleaved,
#                                5 rounds, medians of the rounds' p50, p99
#                                and of each round's difference to direct
#   bash bench/scripts/run.sh --pairs 10 also runs ackproxy unauthenticated and
#                                logged in back to back, 10 pairs per test,
#                                and reports the median of the pairs'
#                                ratios: both halves of a pair see the same
#                                load on a shared machine
#
# Every process it starts is stopped on exit. Output: bench/out/.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PATH:/usr/sbin:/usr/local/sbin"

n=200000
idle=10000
hold=5
rounds=2
smoke=0
baseline=""
pairs=0
latency=0
only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) smoke=1; n=5000; idle=500; hold=2; rounds=1 ;;
    -n) n="$2"; shift ;;
    --idle) idle="$2"; shift ;;
    --rounds) rounds="$2"; shift ;;
    --baseline) baseline="$2"; shift ;;
    --pairs) pairs="$2"; shift ;;
    --latency) latency="$2"; shift ;;
    --tests) only="$2"; shift ;;
    *) echo "usage: $0 [--smoke] [-n requests] [--idle connections] [--rounds r] [--baseline bin] [--pairs k] [--latency rounds] [--tests set,get,lpush,rpop]" >&2; exit 2 ;;
  esac
  shift
done

for tool in redis-server redis-cli redis-benchmark nutcracker openssl; do
  command -v "$tool" >/dev/null || { echo "$tool not found: run bash tests/setup-bench-deps.sh" >&2; exit 1; }
done

# The idle-connection measurement needs a descriptor per client in the
# proxy (which inherits this limit) and in the load generator.
hard=$(ulimit -Hn)
if [ "$hard" = unlimited ]; then ulimit -Sn 1048576 2>/dev/null || true
else ulimit -Sn "$hard" 2>/dev/null || true; fi
if [ "$(ulimit -Sn)" != unlimited ] && [ "$(ulimit -Sn)" -lt $((idle + 100)) ]; then
  echo "ulimit -n is $(ulimit -Sn): too low for $idle idle connections" >&2
  exit 1
fi

out="bench/out"
mkdir -p "$out"

# Build, and take the paths from cargo (CARGO_TARGET_DIR is respected).
# One `cargo bench --no-run` builds both the release (bench profile =
# release settings) ackproxy binary and idle_conns, sharing the artifacts
# that `cargo test --release` left, so tests/run.sh compiles little here.
built=$(cargo bench --quiet --bench idle_conns --no-run --message-format=json-render-diagnostics \
  | grep -o '"executable":"[^"]*"' | cut -d'"' -f4)
proxy_bin=$(grep '/ackproxy$' <<<"$built" | head -1)
idle_bin=$(grep '/idle_conns-[^/]*$' <<<"$built" | head -1)
[ -x "$proxy_bin" ] && [ -x "$idle_bin" ] || { echo "build produced no binaries" >&2; exit 1; }

source bench/scripts/lib.sh

# Test certificates for the TLS measurements, made for this run: a CA and
# a certificate for 127.0.0.1 it signed (ECDSA P-256).
tls="$PWD/$out/tls"  # absolute: redis-server changes to its --dir first
mkdir -p "$tls"
{
  openssl ecparam -name prime256v1 -genkey -noout -out "$tls/ca.key"
  openssl req -x509 -new -key "$tls/ca.key" -days 2 -subj "/CN=ackproxy bench CA" -out "$tls/ca.pem"
  openssl ecparam -name prime256v1 -genkey -noout -out "$tls/server.key"
  openssl req -new -key "$tls/server.key" -subj "/CN=localhost" -out "$tls/server.csr"
  openssl x509 -req -in "$tls/server.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" \
    -CAcreateserial -days 2 -out "$tls/server.pem" \
    -extfile <(printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n')
} >"$out/openssl.log" 2>&1 || { cat "$out/openssl.log" >&2; echo "openssl failed" >&2; exit 1; }

# One Redis for everything, its TLS port beside the plain one.
redis_port=$(free_port)
redis_tls_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
  --tls-port "$redis_tls_port" --tls-cert-file "$tls/server.pem" \
  --tls-key-file "$tls/server.key" --tls-ca-cert-file "$tls/ca.pem" --tls-auth-clients no \
  --daemonize no --dir "$out" >"$out/redis.log" 2>&1 &
redis_pid=$!
pids+=("$redis_pid")
wait_ping "$redis_port" "$redis_pid" redis
# A user with every right, for the logged-in measurements.
bench_pass=bench-pass
[ "$(redis-cli -p "$redis_port" ACL SETUSER bench on ">$bench_pass" '~*' '&*' +@all)" = OK ] \
  || { echo "ACL SETUSER bench failed" >&2; exit 1; }
login=(--user bench -a "$bench_pass")

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
# Foreground process (-d needs /run/nutcracker), backgrounded here.
nutcracker -c "$out/nutcracker.yml" -o "$out/nutcracker.log" -a 127.0.0.1 -s "$(free_port)" \
  >/dev/null 2>&1 &
twem_pid=$!
pids+=("$twem_pid")
wait_ping "$twem_port" "$twem_pid" nutcracker

proxy_port=$(free_port)
RUST_LOG=warn "$proxy_bin" --listen "127.0.0.1:$proxy_port" \
  --upstream "127.0.0.1:$redis_port" >"$out/ackproxy.log" 2>&1 &
proxy_pid=$!
pids+=("$proxy_pid")
wait_ping "$proxy_port" "$proxy_pid" ackproxy

# ackproxy's TLS listener (no client certificates, as the Redis above),
# with a plain upstream and with a TLS one. Each also listens in plain
# text, which is how it is found to be up.
tls_args=(--tls-cert-file "$tls/server.pem" --tls-key-file "$tls/server.key" --tls-auth-clients no)
ptls_plain=$(free_port); ptls_port=$(free_port)
RUST_LOG=warn "$proxy_bin" --listen "127.0.0.1:$ptls_plain" --upstream "127.0.0.1:$redis_port" \
  --tls-listen "127.0.0.1:$ptls_port" "${tls_args[@]}" >"$out/ackproxy-tls.log" 2>&1 &
ptls_pid=$!
pids+=("$ptls_pid")
wait_ping "$ptls_plain" "$ptls_pid" ackproxy-tls
ptls2_plain=$(free_port); ptls2_port=$(free_port)
RUST_LOG=warn "$proxy_bin" --listen "127.0.0.1:$ptls2_plain" --upstream "127.0.0.1:$redis_tls_port" \
  --upstream-tls --upstream-tls-ca-cert-file "$tls/ca.pem" \
  --tls-listen "127.0.0.1:$ptls2_port" "${tls_args[@]}" >"$out/ackproxy-tls2.log" 2>&1 &
ptls2_pid=$!
pids+=("$ptls2_pid")
wait_ping "$ptls2_plain" "$ptls2_pid" ackproxy-tls2

if [ -n "$baseline" ]; then
  base_port=$(free_port)
  RUST_LOG=warn "$baseline" --listen "127.0.0.1:$base_port" \
    --upstream "127.0.0.1:$redis_port" >"$out/baseline.log" 2>&1 &
  base_pid=$!
  pids+=("$base_pid")
  wait_ping "$base_port" "$base_pid" baseline
fi

declare -A rps p50 p99 cpu
# The proxies' CPU per request (utime + stime over a measurement): unlike
# rates, it hardly moves when other processes load the machine.
declare -A pid_of=([ackproxy]=$proxy_pid [ackproxy-auth]=$proxy_pid
  [ackproxy-tls]=$ptls_pid [ackproxy-tls2]=$ptls2_pid [twemproxy]=$twem_pid)
if [ -n "$baseline" ]; then pid_of[baseline]=$base_pid; fi
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
csv="$out/benchmark.csv"
echo "target,test,pipeline,rps,avg_ms,min_ms,p50_ms,p95_ms,p99_ms,max_ms" >"$csv"
# One redis-benchmark run: its CSV line, without quotes. redis-benchmark
# 7.0 --csv: "test","rps","avg_latency_ms","min_latency_ms",
# "p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms".
# Its opening CONFIG GET fails on twemproxy; it warns and goes on.
run_benchmark() { # port test pipeline [redis-benchmark options]
  local line port=$1 t=$2 pipe=$3
  shift 3
  line=$(redis-benchmark -h 127.0.0.1 -p "$port" -c 50 -n "$n" -P "$pipe" -t "$t" \
    -r 100000 --csv "$@" 2>>"$out/redis-benchmark.err" | tail -1) || return 1
  echo "${line//\"/}"
}

measure() { # target port test pipeline [redis-benchmark options]
  local line r q50 q99 target=$1 port=$2 t=$3 pipe=$4
  local pid=${pid_of[$1]:-} t0=0 c=""
  shift 4
  if [ -n "$pid" ]; then t0=$(ticks "$pid"); fi
  if ! line=$(run_benchmark "$port" "$t" "$pipe" "$@"); then
    echo "redis-benchmark failed against $target ($t, P$pipe)" >&2
    exit 1
  fi
  if [ -n "$pid" ]; then
    c=$(awk "BEGIN{printf \"%.2f\", ($(ticks "$pid") - $t0) * 1e6 / $hz / $n}")
  fi
  IFS=, read -r _ r _ _ q50 _ q99 _ <<<"$line"
  if ! [[ "$r" =~ ^[0-9.]+$ ]] || [ "${r%.*}" -eq 0 ]; then
    echo "redis-benchmark gave no result against $target ($t, P$pipe): '$line'" >&2
    exit 1
  fi
  echo "$target,$line" | sed "s/^\([^,]*\),\([^,]*\),/\1,\2,$pipe,/" >>"$csv"
  local key="$target/$t/P$pipe"
  # Keep the best of the rounds: the machine is shared by all processes.
  if [ -z "${rps[$key]:-}" ] || awk "BEGIN{exit !($r > ${rps[$key]})}"; then
    rps[$key]=$r; p50[$key]=$q50; p99[$key]=$q99
  fi
  # The least CPU per request of the rounds: the one least disturbed.
  if [ -n "$c" ] && { [ -z "${cpu[$key]:-}" ] || awk "BEGIN{exit !($c < ${cpu[$key]})}"; }; then
    cpu[$key]=$c
  fi
}

: >"$out/redis-benchmark.err"
load_before=$(cut -d" " -f1-3 /proc/loadavg)
tests=(set get lpush rpop)
if [ -n "$only" ]; then IFS=, read -r -a tests <<<"$only"; fi
for pipe in 1 16; do
  for t in "${tests[@]}"; do
    for _ in $(seq "$rounds"); do
      # Interleaved so that drift on the machine affects all three alike.
      measure direct "$redis_port" "$t" "$pipe"
      measure twemproxy "$twem_port" "$t" "$pipe"
      measure ackproxy "$proxy_port" "$t" "$pipe"
      measure direct-auth "$redis_port" "$t" "$pipe" "${login[@]}"
      measure ackproxy-auth "$proxy_port" "$t" "$pipe" "${login[@]}"
      if [ -n "$baseline" ]; then measure baseline "$base_port" "$t" "$pipe"; fi
    done
  done
done
tls_tests=(set get)
cacert=(--tls --cacert "$tls/ca.pem")
for pipe in 1 16; do
  for t in "${tls_tests[@]}"; do
    for _ in $(seq "$rounds"); do
      measure direct-tls "$redis_tls_port" "$t" "$pipe" "${cacert[@]}"
      measure ackproxy-tls "$ptls_port" "$t" "$pipe" "${cacert[@]}"
      measure ackproxy-tls2 "$ptls2_port" "$t" "$pipe" "${cacert[@]}"
    done
  done
done
alive "$redis_pid" redis; alive "$twem_pid" nutcracker; alive "$proxy_pid" ackproxy
alive "$ptls_pid" ackproxy-tls; alive "$ptls2_pid" ackproxy-tls2

ratio() { awk "BEGIN{if ($2 == 0) print \"-\"; else printf \"%.2f\", $1/$2}"; }
report="$out/report.txt"
{
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'); $(nproc) cores; load average before: $load_before"
  echo "redis-benchmark -c 50 -n $n -r 100000 [-P 16]; best of $rounds round(s); rps, p50/p99 in ms"
  printf '%-6s %-4s | %10s %13s | %10s %13s | %10s %13s | %7s %7s\n' \
    test pipe direct p50/p99 twemproxy p50/p99 ackproxy p50/p99 ack/dir ack/twem
  for pipe in 1 16; do
    for t in "${tests[@]}"; do
      d="direct/$t/P$pipe"; w="twemproxy/$t/P$pipe"; a="ackproxy/$t/P$pipe"
      printf '%-6s P%-3s | %10s %13s | %10s %13s | %10s %13s | %7s %7s\n' \
        "${t^^}" "$pipe" \
        "${rps[$d]}" "${p50[$d]}/${p99[$d]}" \
        "${rps[$w]}" "${p50[$w]}/${p99[$w]}" \
        "${rps[$a]}" "${p50[$a]}/${p99[$a]}" \
        "$(ratio "${rps[$a]}" "${rps[$d]}")" "$(ratio "${rps[$a]}" "${rps[$w]}")"
    done
  done
  echo
  echo "each proxy's CPU in µs per request (user + system, least of the rounds)"
  printf '%-6s %-4s | %9s %9s | %9s\n' test pipe twemproxy ackproxy ack/twem
  for pipe in 1 16; do
    for t in "${tests[@]}"; do
      w="twemproxy/$t/P$pipe"; a="ackproxy/$t/P$pipe"
      printf '%-6s P%-3s | %9s %9s | %9s\n' "${t^^}" "$pipe" \
        "${cpu[$w]}" "${cpu[$a]}" "$(ratio "${cpu[$a]}" "${cpu[$w]}")"
    done
  done
  echo
  echo "logged in as user bench (redis-benchmark --user bench -a ...), against the figures above;"
  echo "proxy CPU in µs per request (user + system), unauthenticated and logged in"
  printf '%-6s %-4s | %10s %13s | %10s %13s | %7s %11s | %7s %7s %11s\n' \
    test pipe direct p50/p99 ackproxy p50/p99 ack/dir auth/unauth cpu cpu-auth auth/unauth
  for pipe in 1 16; do
    for t in "${tests[@]}"; do
      d="direct-auth/$t/P$pipe"; a="ackproxy-auth/$t/P$pipe"; u="ackproxy/$t/P$pipe"
      printf '%-6s P%-3s | %10s %13s | %10s %13s | %7s %11s | %7s %7s %11s\n' "${t^^}" "$pipe" \
        "${rps[$d]}" "${p50[$d]}/${p99[$d]}" "${rps[$a]}" "${p50[$a]}/${p99[$a]}" \
        "$(ratio "${rps[$a]}" "${rps[$d]}")" "$(ratio "${rps[$a]}" "${rps[$u]}")" \
        "${cpu[$u]}" "${cpu[$a]}" "$(ratio "${cpu[$a]}" "${cpu[$u]}")"
    done
  done
  echo
  echo "TLS (redis-benchmark --tls): Redis's TLS port; ackproxy's TLS listener to plain Redis; both sides TLS"
  echo "(cpu: the proxy's CPU µs per request, least of the rounds)"
  printf '%-6s %-4s | %10s %13s | %10s %13s %5s | %10s %13s %5s | %7s %7s\n' \
    test pipe direct-tls p50/p99 tls-plain p50/p99 cpu tls-tls p50/p99 cpu tp/dir tt/dir
  for pipe in 1 16; do
    for t in "${tls_tests[@]}"; do
      d="direct-tls/$t/P$pipe"; a="ackproxy-tls/$t/P$pipe"; b="ackproxy-tls2/$t/P$pipe"
      printf '%-6s P%-3s | %10s %13s | %10s %13s %5s | %10s %13s %5s | %7s %7s\n' \
        "${t^^}" "$pipe" \
        "${rps[$d]}" "${p50[$d]}/${p99[$d]}" \
        "${rps[$a]}" "${p50[$a]}/${p99[$a]}" "${cpu[$a]}" \
        "${rps[$b]}" "${p50[$b]}/${p99[$b]}" "${cpu[$b]}" \
        "$(ratio "${rps[$a]}" "${rps[$d]}")" "$(ratio "${rps[$b]}" "${rps[$d]}")"
    done
  done
  if [ -n "$baseline" ]; then
    echo
    echo "before/after: baseline = $baseline"
    echo "(cpu: the proxy's CPU µs per request, least of the rounds)"
    printf '%-6s %-4s | %10s %13s %5s | %10s %13s %5s | %7s %7s\n' \
      test pipe baseline p50/p99 cpu ackproxy p50/p99 cpu 'rps a/b' 'cpu a/b'
    for pipe in 1 16; do
      for t in "${tests[@]}"; do
        b="baseline/$t/P$pipe"; a="ackproxy/$t/P$pipe"
        printf '%-6s P%-3s | %10s %13s %5s | %10s %13s %5s | %7s %7s\n' "${t^^}" "$pipe" \
          "${rps[$b]}" "${p50[$b]}/${p99[$b]}" "${cpu[$b]}" \
          "${rps[$a]}" "${p50[$a]}/${p99[$a]}" "${cpu[$a]}" \
          "$(ratio "${rps[$a]}" "${rps[$b]}")" "$(ratio "${cpu[$a]}" "${cpu[$b]}")"
      done
    done
  fi
} >"$report"
cat "$report"

if [ "$pairs" -gt 0 ]; then
  rps_of() { # port test pipeline [options]
    local line r
    line=$(run_benchmark "$@") || { echo "redis-benchmark failed ($*)" >&2; exit 1; }
    IFS=, read -r _ r _ <<<"$line"
    echo "$r"
  }
  {
    echo
    echo "ackproxy logged in as bench / unauthenticated: median of $pairs back-to-back pairs"
    echo "(the order alternates; each pair's ratio, then the median)"
    for pipe in 1 16; do
      for t in "${tests[@]}"; do
        ratios=()
        for i in $(seq "$pairs"); do
          if (( i % 2 )); then
            u=$(rps_of "$proxy_port" "$t" "$pipe"); a=$(rps_of "$proxy_port" "$t" "$pipe" "${login[@]}")
          else
            a=$(rps_of "$proxy_port" "$t" "$pipe" "${login[@]}"); u=$(rps_of "$proxy_port" "$t" "$pipe")
          fi
          ratios+=("$(ratio "$a" "$u")")
        done
        median=$(printf '%s\n' "${ratios[@]}" | sort -n \
          | awk '{v[NR] = $1} END {if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2}')
        printf '%-6s P%-3s | median %s | %s\n' "${t^^}" "$pipe" "$median" "${ratios[*]}"
      done
    done
  } | tee -a "$report"
  alive "$proxy_pid" ackproxy
fi

if [ "$latency" -gt 0 ]; then
  median() { tr ' ' '\n' | grep . | sort -g \
    | awk '{v[NR] = $1} END {if (NR % 2) printf "%.3f\n", v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
  declare -A lat_rps lat_50 lat_99 add_50 add_99
  for _ in $(seq "$latency"); do
    for target in direct twemproxy ackproxy; do
      case $target in direct) port=$redis_port ;; twemproxy) port=$twem_port ;; ackproxy) port=$proxy_port ;; esac
      # The later -c wins over run_benchmark's -c 50.
      line=$(run_benchmark "$port" get 1 -c 10) || { echo "redis-benchmark failed against $target (latency)" >&2; exit 1; }
      IFS=, read -r _ r _ _ q50 _ q99 _ <<<"$line"
      lat_rps[$target]+="$r "; lat_50[$target]+="$q50 "; lat_99[$target]+="$q99 "
      if [ "$target" = direct ]; then d50=$q50; d99=$q99
      else
        add_50[$target]+="$(awk "BEGIN{print ($q50 - $d50) * 1000}") "
        add_99[$target]+="$(awk "BEGIN{print ($q99 - $d99) * 1000}") "
      fi
    done
  done
  {
    echo
    echo "GET from 10 clients, no pipelining (redis-benchmark -c 10 -n $n -r 100000 -t get);"
    echo "$latency rounds, the targets interleaved; medians of the rounds"
    printf '%-10s | %10s | %8s %8s | %14s %14s\n' target rps 'p50 ms' 'p99 ms' 'added p50 µs' 'added p99 µs'
    for target in direct twemproxy ackproxy; do
      a50=-; a99=-
      if [ "$target" != direct ]; then
        a50=$(median <<<"${add_50[$target]}"); a99=$(median <<<"${add_99[$target]}")
      fi
      printf '%-10s | %10s | %8s %8s | %14s %14s\n' "$target" "$(median <<<"${lat_rps[$target]}")" \
        "$(median <<<"${lat_50[$target]}")" "$(median <<<"${lat_99[$target]}")" "$a50" "$a99"
    done
  } | tee -a "$report"
  alive "$proxy_pid" ackproxy
fi

# Memory with many idle clients: each connects, sends one PING, reads the
# PONG, then idles while VmRSS is read.
rss() { awk '/^VmRSS/ {print $2}' "/proc/$proxy_pid/status"; }
before=$(rss)
"$idle_bin" "127.0.0.1:$proxy_port" "$idle" "$hold" >"$out/idle.log" 2>&1 &
idle_pid=$!
pids+=("$idle_pid")
for _ in $(seq 1200); do
  grep -q holding "$out/idle.log" 2>/dev/null && break
  kill -0 "$idle_pid" 2>/dev/null || break
  sleep 0.1
done
if ! grep -q holding "$out/idle.log"; then
  cat "$out/idle.log" >&2
  echo "idle connections failed" >&2
  exit 1
fi
sleep 0.5
during=$(rss)
wait "$idle_pid" || { cat "$out/idle.log" >&2; echo "idle_conns failed" >&2; exit 1; }
alive "$proxy_pid" ackproxy
echo "ackproxy VmRSS: ${before} kB before, ${during} kB with ${idle} idle clients connected" \
  | tee -a "$report"

if [ "$smoke" = 1 ]; then
  # The queue pairs benchmark (its own load generator process, seed 000's
  # scripts and Streams beside ackproxy): every mode must move messages.
  PAIRS_SMOKE=1 ACKPROXY_BIN="$proxy_bin" cargo bench --quiet --bench pairs
  # A parked pop's wake-up latency: a few samples, to keep it running.
  ACKPROXY_WAKE_SAMPLES=20 ACKPROXY_BIN="$proxy_bin" cargo bench --quiet --bench wake_latency
  # Real frameworks (rq, Celery) through ackproxy against Redis: every job done,
  # every lease acknowledged by the framework's own finish.
  python3 bench/scripts/framework_jobs.py --smoke --ackproxy "$proxy_bin"
fi
