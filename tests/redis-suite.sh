#!/usr/bin/env bash
# Runs some of Redis's own Tcl test units (from Debian's source package of
# the installed redis-server) against a plain redis-server and through
# ackproxy, and reports the tests whose outcome differs. The proxy claims to
# be transparent for everything it does not rewrite; Redis's suite knows far
# more corner cases of MULTI, scripting, functions and CLIENT PAUSE than our
# own tests do.
#
# Modes: direct (plain redis-server), proxy (shared connections), dedicated
# (--dedicated-per-client), rule (proxy with a [[queue]] rule in force whose
# keys the tests never use) and loaded (rule, with the proxy's function
# library in Redis: a queue pop through the proxy loads it before the unit,
# and again soon after a test's FUNCTION FLUSH removed it). rule and
# loaded run only the units that see functions and scripts
# (unit/scripting, unit/functions) unless given with --mode.
#
# Usage: tests/redis-suite.sh [--unit unit/NAME]... [--mode MODE]...
#          [--unit-timeout SEC] [--stall-timeout SEC] [--max-hangs N]
#          [--with-repl] [--select] [--proxy-config FILE] [--only TEST]...
#          [--work DIR] [--findings FILE]
#
# Exit status: 0 if no test passes directly but fails through the proxy,
# 1 if some do, 2 if the suite could not be set up.
#
# Needs: Debian with redis-server installed, apt access to Debian's archive
# (for the source package), and root if tcl or dpkg-dev must be installed.
# Never commits nor copies Redis's code anywhere but the scratch directory.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
export PATH="$PATH:/usr/sbin:/usr/local/sbin"

UNITS=()
MODES=()
ONLY=()
# A whole unit through a hanging proxy must not block the run forever; 600 s
# is several times what the slowest of these units needs directly.
UNIT_TIMEOUT=600
# The suite's own "no progress" watchdog: it reports which test was running,
# which a wall-clock kill cannot. No test of these units is silent for 30 s
# against a healthy server (the large-memory ones are not enabled).
STALL_TIMEOUT=30
# After a hang the unit is rerun without the hanging test so that the tests
# after it still get a verdict; this bounds the number of reruns.
MAX_HANGS=10
WITH_REPL=0
SINGLEDB=1
PROXY_CONFIG=""
WORK="${REDIS_SUITE_WORK:-$ROOT/target/redis-suite}"
FINDINGS=""

die() { echo "redis-suite: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --unit|--mode|--only|--unit-timeout|--stall-timeout|--max-hangs|--proxy-config|--work|--findings)
      [ $# -ge 2 ] || die "$1 needs a value" ;;
  esac
  case "$1" in
    --unit) UNITS+=("$2"); shift 2 ;;
    --mode) MODES+=("$2"); shift 2 ;;
    --only) ONLY+=("$2"); shift 2 ;;
    --unit-timeout) UNIT_TIMEOUT=$2; shift 2 ;;
    --stall-timeout) STALL_TIMEOUT=$2; shift 2 ;;
    --max-hangs) MAX_HANGS=$2; shift 2 ;;
    --with-repl) WITH_REPL=1; shift ;;
    --select) SINGLEDB=0; shift ;;
    --proxy-config) PROXY_CONFIG=$(realpath "$2"); shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --findings) FINDINGS=$2; shift 2 ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) die "unknown argument: $1" ;;
  esac
done
[ ${#UNITS[@]} -gt 0 ] || UNITS=(unit/multi unit/scripting unit/functions unit/pause unit/introspection)
# Units in which the proxy's function library could show, for the modes
# that have one in Redis.
RULE_UNITS=" unit/scripting unit/functions "
ALL_PAIRS=0
if [ ${#MODES[@]} -eq 0 ]; then
  MODES=(direct proxy dedicated rule loaded)
else
  ALL_PAIRS=1
fi
for m in "${MODES[@]}"; do
  case "$m" in direct|proxy|dedicated|rule|loaded) ;; *) die "unknown mode $m" ;; esac
done
# Whether UNIT runs in MODE.
runs_in() { # unit mode
  case "$2" in
    rule|loaded) [ "$ALL_PAIRS" = 1 ] || [[ "$RULE_UNITS" == *" $1 "* ]] ;;
    *) true ;;
  esac
}
# Differences are only meaningful against the direct run.
case " ${MODES[*]} " in *" direct "*) ;; *) MODES=(direct "${MODES[@]}") ;; esac
mkdir -p "$WORK"
WORK=$(realpath "$WORK")
FINDINGS=${FINDINGS:-$WORK/findings.txt}
PROXY_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/ackproxy"

# --- processes we start, killed by PID on any exit -------------------------
PIDS=()
stop_pid() {
  local pid=$1 i
  kill -TERM "$pid" 2>/dev/null || return 0
  # A proxy or server stuck behind a busy script may ignore SIGTERM for long;
  # the next unit needs the ports and the CPU, so escalate after 5 s.
  for i in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do stop_pid "$pid"; done
  PIDS=()
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- dependencies ------------------------------------------------------------
need_pkg() { # command package
  command -v "$1" >/dev/null 2>&1 && return 0
  [ "$(id -u)" = 0 ] || die "$1 is missing: install package $2"
  # A fresh machine may have empty package lists.
  apt-get install -y --no-install-recommends "$2" >/dev/null 2>&1 || {
    apt-get update -qq && apt-get install -y --no-install-recommends "$2" >/dev/null
  } || die "cannot install $2"
}
command -v redis-server >/dev/null || die "redis-server is not installed"
command -v redis-cli >/dev/null || die "redis-cli is not installed (package redis-tools)"
need_pkg tclsh tcl
need_pkg dpkg-source dpkg-dev
need_pkg timeout coreutils
if [ ! -x "$PROXY_BIN" ]; then
  cargo build --release >&2 || die "cannot build ackproxy"
fi

SERVER_VERSION=$(redis-server --version | sed -n 's/.*v=\([0-9.]*\).*/\1/p')
[ -n "$SERVER_VERSION" ] || die "cannot read redis-server's version"
if [ "$SERVER_VERSION" != 7.0.15 ]; then
  echo "redis-suite: warning: redis-server is $SERVER_VERSION; this script was written for 7.0.15" >&2
fi

# --- the test suite: Debian's source package of the installed server ---------
# The tests must come from the very version of the server they run against:
# they test exact error messages and behaviours that change between releases.
# apt gets its own sources list and package lists under $WORK, so the
# machine's apt configuration is not changed and `apt-get update` of the
# machine is not needed to get deb-src indexes.
fetch_source() {
  local apt="$WORK/apt" src="$WORK/src" codename srcpkg debver
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  srcpkg=$(dpkg-query -W -f='${source:Package}' redis-server 2>/dev/null || echo redis)
  debver=$(dpkg-query -W -f='${source:Version}' redis-server 2>/dev/null || true)
  if [ -f "$src/.fetched" ] && [ "$(cat "$src/.fetched")" = "$srcpkg=$debver" ] &&
     [ -f "$src/tree/tests/test_helper.tcl" ]; then
    return 0
  fi
  rm -rf "$apt" "$src"
  mkdir -p "$apt/parts" "$apt/lists/partial" "$src"
  : > "$apt/empty.list"
  # deb-src twins of the machine's own Debian entries: same mirrors, same
  # suites. Third-party repositories are left out (they rarely carry
  # sources, and a failing one would fail the update); an entry belongs to
  # Debian here when one of its suites is the release's codename or
  # codename-something (bookworm, bookworm-updates, bookworm-security).
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk -v c="$codename" '
      $1 == "deb" {
        for (i = 2; i <= NF; i++)
          if (c == "" || $i ~ ("^" c "(-[a-z]+)?$")) { sub(/^deb/, "deb-src"); print; next }
      }' "$f"
  done > "$apt/parts/debian-src.list"
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk -v c="$codename" '
      BEGIN { RS = ""; ORS = "\n\n"; IGNORECASE = 1 }
      {
        if ($0 !~ /(^|\n)Types:[^\n]*(^|[ \t])deb([ \t]|\n|$)/) next
        if ($0 ~ /(^|\n)Enabled:[ \t]*no/) next
        if (c != "" && $0 !~ ("(^|\n)Suites:[^\n]*[ \t]" c "(-[a-z]+)?([ \t]|\n|$)")) next
        sub(/(^|\n)Types:[^\n]*/, "\nTypes: deb-src")
        sub(/^\n/, "")
        print
      }' "$f"
  done > "$apt/parts/debian-src.sources"
  [ -s "$apt/parts/debian-src.list" ] || rm -f "$apt/parts/debian-src.list"
  [ -s "$apt/parts/debian-src.sources" ] || rm -f "$apt/parts/debian-src.sources"
  ls "$apt/parts"/* >/dev/null 2>&1 || die "no Debian entry in the apt sources to derive deb-src from"
  local opts=(-o "Dir::Etc::SourceList=$apt/empty.list" -o "Dir::Etc::SourceParts=$apt/parts"
              -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache")
  mkdir -p "$apt/cache/archives/partial"
  apt-get "${opts[@]}" update -qq >&2 || die "apt-get update of the deb-src lists failed"
  # The exact Debian revision first (it carries Debian's patches to the tests);
  # any source of the same upstream version if the archive dropped it.
  ( cd "$src" && { apt-get "${opts[@]}" source -qq "$srcpkg=$debver" >&2 ||
                   apt-get "${opts[@]}" source -qq "$srcpkg" >&2; } ) ||
    die "apt-get source $srcpkg failed"
  local tree
  tree=$(find "$src" -mindepth 1 -maxdepth 1 -type d -name "$srcpkg-*" | head -1)
  [ -n "$tree" ] && [ -f "$tree/tests/test_helper.tcl" ] || die "no test suite in the source package"
  ln -sfn "$tree" "$src/tree"
  echo "$srcpkg=$debver" > "$src/.fetched"
}
fetch_source
SRC="$WORK/src/tree"
SOURCE_VERSION=$(sed -n 's/.*REDIS_VERSION "\([0-9.]*\)".*/\1/p' "$SRC/src/version.h")
[ "$SOURCE_VERSION" = "$SERVER_VERSION" ] ||
  die "source package is Redis $SOURCE_VERSION but redis-server is $SERVER_VERSION"
for u in "${UNITS[@]}"; do [ -f "$SRC/tests/$u.tcl" ] || die "no test unit $u"; done

# --- ports -------------------------------------------------------------------
# Random loopback ports, checked free, so that parallel runs on a shared
# machine and the system's own redis on 6379 are never hit. They stay below
# the ephemeral range: a port nobody listens on may still be the local end of
# one of the many short connections the suite opens, and then bind fails.
EPHEMERAL_LOW=$(awk '{ print $1 }' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
[ "$EPHEMERAL_LOW" -gt 12000 ] || EPHEMERAL_LOW=32768
free_port() {
  local p
  while :; do
    p=$((10000 + RANDOM % (EPHEMERAL_LOW - 10000)))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}
wait_ping() { # port pid
  local i
  for i in $(seq 100); do
    kill -0 "$2" 2>/dev/null || return 1
    [ "$(redis-cli -p "$1" ping 2>/dev/null)" = PONG ] && return 0
    sleep 0.1
  done
  return 1
}

# --- queue rules ---------------------------------------------------------------
# The rule of the rule and loaded modes: in force, but on keys no test uses.
RULE_KEY="ackproxy-suite-queue:load"
RULE_CONFIG="$WORK/rule.toml"
{
  if [ -n "$PROXY_CONFIG" ]; then cat "$PROXY_CONFIG"; echo; fi
  printf '[[queue]]\npattern = "ackproxy-suite-queue:*"\nlease_ms = 60000\n'
} > "$RULE_CONFIG"

# Keeps the proxy's library in Redis for the loaded mode, as a deployment
# whose workers pop all the time does. One pop through the proxy loads it
# before the unit; its FUNCTION DUMP (Redis has no other library then) is
# the library as the proxy loads it. Redis is then asked directly (the
# proxy hides the library) every millisecond whether it has it, and when a
# test's FUNCTION FLUSH (or RESTORE ... FLUSH) removed it, that dump is
# restored. Restoring it directly rather than popping again sends Redis
# nothing a test could count: a pop would first get the "Function not
# found" that makes the proxy load its library, which Redis counts among
# its error replies. Nothing is restored under maxmemory, where Redis would
# refuse it (and count that). Whether the library is back in time for a
# given test depends on timing: this exercises the hiding at random
# points; tests/suite/function_view.rs checks it at fixed ones. Two processes,
# each killed by its PID (the loop's own redis-cli ends when the loop
# does); every restore is logged to DIR/loads.
start_loader() { # redis-port proxy-port dir -> LOADER_PIDS
  local polled="$3/loader.polled" dump
  redis-cli -p "$2" RPOP "$RULE_KEY" >/dev/null
  [ -n "$(redis-cli -p "$1" FUNCTION LIST LIBRARYNAME 'ackproxy_*')" ] ||
    die "a queue pop through the proxy did not load its library (see $3/proxy.log)"
  # One line, quoted and escaped as redis-cli reads it back.
  dump=$(redis-cli --csv -p "$1" FUNCTION DUMP)
  rm -f "$polled"
  mkfifo "$polled"
  : > "$3/loads"
  redis-cli --csv -p "$1" -r -1 -i 0.001 FUNCTION LIST LIBRARYNAME 'ackproxy_*' \
    >"$polled" 2>/dev/null &
  LOADER_PIDS=($!)
  reload_loop "$1" "$dump" "$3/loads" <"$polled" &
  LOADER_PIDS+=($!)
  PIDS+=("${LOADER_PIDS[@]}")
}

# Tests the loaded mode skips. This one counts every error reply Redis made
# since its CONFIG RESETSTAT and sets maxmemory right after the flush that
# starts its server block, when the loader restores the library: a restore
# checked before the maxmemory and made after it is refused, and counted.
# It tests EVAL's error statistics, no function, and runs in every other
# mode.
LOADED_SKIPS=("Consistent eval error reporting")

reload_loop() { # redis-port dump log; stdin: the polls' replies, one a line
  local line missing=0 reply
  coproc LOAD { redis-cli --csv -p "$1" 2>&1; }
  while IFS= read -r line; do
    if [ -n "$line" ]; then missing=0; continue; fi
    # At once, then every 100 polls while it could not be restored (Redis
    # busy with a script, say).
    if [ $((missing % 100)) = 0 ]; then
      echo "CONFIG GET maxmemory" >&"${LOAD[1]}"
      IFS= read -r reply <&"${LOAD[0]}"
      if [ "$reply" = '"maxmemory","0"' ]; then
        printf 'FUNCTION RESTORE %s\n' "$2" >&"${LOAD[1]}"
        IFS= read -r reply <&"${LOAD[0]}"
        printf '%s %s\n' "$EPOCHREALTIME" "$reply" >> "$3"
      fi
    fi
    missing=$((missing + 1))
  done
}

# --- one run of one unit in one mode -----------------------------------------
# Tags: external:skip is dropped by the suite itself in external mode (tests
# that restart, reconfigure or inspect the server's process and files). We
# start the server ourselves with the DEBUG command enabled, so needs:debug,
# needs:config-maxmemory and friends can run. needs:repl tests open a raw
# connection and send SYNC to read the replication stream; through the proxy
# that connection never gets the RDB payload, so each such test stalls until
# the watchdog fires: they are off unless --with-repl.
TAGS=""
[ "$WITH_REPL" = 1 ] || TAGS="-needs:repl"

# run_once UNIT MODE DIR SKIP... -> DIR/{suite.log,redis.log,rc}
run_once() {
  local unit=$1 mode=$2 dir=$3; shift 3
  local rport pport port rpid ppid rc=0 args pid
  mkdir -p "$dir"
  local try
  # A fresh server for every run: a hung test may leave a script running or
  # clients paused, which would make every later test fail for that reason.
  # Another process may take the chosen port before we bind it: retry.
  for try in 1 2 3 4 5; do
    rport=$(free_port)
    redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no \
      --dir "$dir" --logfile "$dir/redis.log" --enable-debug-command yes \
      --daemonize no >/dev/null 2>&1 &
    rpid=$!; PIDS+=("$rpid")
    wait_ping "$rport" "$rpid" && break
    stop_pid "$rpid"
    [ "$try" = 5 ] && die "redis-server did not start (see $dir/redis.log)"
  done
  port=$rport
  if [ "$mode" != direct ]; then
    for try in 1 2 3 4 5; do
      pport=$(free_port)
      local pargs=(--listen "127.0.0.1:$pport" --upstream "127.0.0.1:$rport")
      [ "$mode" = dedicated ] && pargs+=(--dedicated-per-client)
      case "$mode" in
        rule|loaded) pargs+=(--config "$RULE_CONFIG") ;;
        *) [ -n "$PROXY_CONFIG" ] && pargs+=(--config "$PROXY_CONFIG") ;;
      esac
      "$PROXY_BIN" "${pargs[@]}" >"$dir/proxy.log" 2>&1 &
      ppid=$!; PIDS+=("$ppid")
      wait_ping "$pport" "$ppid" && break
      stop_pid "$ppid"
      [ "$try" = 5 ] && die "ackproxy did not start (see $dir/proxy.log)"
    done
    port=$pport
  fi
  LOADER_PIDS=()
  [ "$mode" = loaded ] && start_loader "$rport" "$pport" "$dir"
  # --durable: an unexpected error reply is an exception in the suite, which
  # would otherwise end the unit at the first proxy difference.
  args=(--host 127.0.0.1 --port "$port" --single "$unit" --clients 1 --durable
        --timeout "$STALL_TIMEOUT" --baseport "$(free_port)")
  [ -n "$TAGS" ] && args+=(--tags "$TAGS")
  [ "$SINGLEDB" = 1 ] && args+=(--singledb)
  local t
  for t in "${ONLY[@]+"${ONLY[@]}"}"; do args+=(--only "$t"); done
  for t in "$@"; do args+=(--skiptest "$t"); done
  # TERM=dumb: no colour codes in the log. timeout signals its whole process
  # group, which includes the test client the suite forks.
  ( cd "$SRC" && TERM=dumb timeout -k 10 "$UNIT_TIMEOUT" tclsh tests/test_helper.tcl "${args[@]}" ) \
    >"$dir/suite.log" 2>&1 </dev/null || rc=$?
  echo "$rc" > "$dir/rc"
  for pid in "${LOADER_PIDS[@]+"${LOADER_PIDS[@]}"}"; do stop_pid "$pid"; done
  [ -n "${ppid:-}" ] && stop_pid "$ppid"
  stop_pid "$rpid"
  PIDS=()
}

# Which test hung: the suite's watchdog names it; after a wall-clock kill the
# last "### Starting test" that the suite logs into the server (DEBUG LOG,
# passed through by the proxy) does.
hung_test() { # dir
  local t
  t=$(sed -n 's/^sock[^ ]* => (IN PROGRESS) //p' "$1/suite.log" | tail -1)
  if [ -z "$t" ]; then
    t=$(sed -n 's/.*### Starting test \(.*\) in tests\/.*\.tcl$/\1/p' "$1/redis.log" | tail -1)
  fi
  printf '%s' "$t"
}

# results DIR -> lines "STATUS<TAB>name" (PASS/FAIL/SKIP) and DIR/errors/<n>
# Names repeated in a unit get "#2", "#3"... so that runs can be compared.
parse_results() {
  local dir=$1
  rm -rf "$dir/errors"; mkdir -p "$dir/errors"
  awk -v errdir="$dir/errors" '
    function uniq(n) { seen[n]++; return seen[n] > 1 ? n " #" seen[n] : n }
    function flush() { if (errfile != "") close(errfile); errfile = "" }
    /^\[(ok|err|skip|ignore|exception|TIMEOUT)\]:|^\[[0-9]+\/[0-9]+ done\]|^ *The End$/ { flush() }
    /^\[skip\]: / { n = $0; sub(/^\[skip\]: /, "", n); print "SKIP\t" uniq(n); next }
    /^\[ok\]: / { n = $0; sub(/^\[ok\]: /, "", n); sub(/ \([0-9]+ ms\)$/, "", n)
                  print "PASS\t" uniq(n); next }
    /^\[err\]: / { n = $0; sub(/^\[err\]: /, "", n); sub(/ in tests\/[^ ]*\.tcl$/, "", n)
                   n = uniq(n); print "FAIL\t" n; k++
                   errfile = errdir "/" k; print n > (errdir "/" k ".name"); close(errdir "/" k ".name")
                   next }
    /^\[exception\]: / { n = $0; sub(/^\[exception\]: /, "", n); k++
                   print "FAIL\t(exception) " n
                   errfile = errdir "/" k; print "(exception) " n > (errdir "/" k ".name"); close(errdir "/" k ".name")
                   next }
    errfile != "" { print > errfile }
  ' "$dir/suite.log"
}

# --- main loop -----------------------------------------------------------------
RUN="$WORK/runs/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$RUN"
echo "redis-suite: Redis $SOURCE_VERSION tests from $SRC; logs in $RUN" >&2

# run_unit UNIT MODE -> $RUN/<unit>.<mode>/{results,hangs,note}
run_unit() {
  local unit=$1 mode=$2 base n=0 skips=() fixed=() h
  [ "$mode" = loaded ] && fixed=("${LOADED_SKIPS[@]}")
  base="$RUN/${unit//\//_}.$mode"
  mkdir -p "$base"; : > "$base/hangs"; : > "$base/note"
  while :; do
    n=$((n + 1))
    echo "redis-suite: $unit via $mode, run $n${skips[0]+ (skipping ${#skips[@]} hung)}" >&2
    local start
    for start in 1 2 3; do
      rm -rf "$base/run$n"
      run_once "$unit" "$mode" "$base/run$n" "${fixed[@]+"${fixed[@]}"}" "${skips[@]+"${skips[@]}"}"
      # The suite's own control port can be taken between its check and its
      # bind; that is no verdict on anything, so start again.
      grep -q "^couldn't open socket" "$base/run$n/suite.log" || break
    done
    parse_results "$base/run$n" > "$base/run$n/results"
    local rc; rc=$(cat "$base/run$n/rc")
    if grep -q '^\[TIMEOUT\]' "$base/run$n/suite.log" || [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
      h=$(hung_test "$base/run$n")
      local why="no progress for ${STALL_TIMEOUT}s"
      { [ "$rc" = 124 ] || [ "$rc" = 137 ]; } && why="unit wall clock ${UNIT_TIMEOUT}s"
      if [ -z "$h" ]; then
        echo "run $n stopped ($why) in an unknown test" >> "$base/note"; break
      fi
      # --skiptest skips every test of that name, and scripting runs most of
      # its tests twice (EVAL and FUNCTION flavours) under the same name: tell
      # which occurrence hung from how many had already finished.
      local k
      k=$(cut -f2 "$base/run$n/results" | sed 's/ #[0-9]*$//' | grep -cxF "$h" || true)
      [ "$k" -gt 0 ] && h="$h #$((k + 1))"
      printf '%s\t%s\n' "$h" "$why" >> "$base/hangs"
      h=${h% #*}
      skips+=("$h")
      if [ ${#skips[@]} -ge "$MAX_HANGS" ]; then
        echo "stopped after $MAX_HANGS hangs; later tests not run" >> "$base/note"; break
      fi
      continue
    fi
    if ! grep -q '^\[[0-9]*/[0-9]* done\]' "$base/run$n/suite.log"; then
      echo "run $n ended early (status $rc): $(grep -m1 '^\[exception\]' "$base/run$n/suite.log" || tail -1 "$base/run$n/suite.log")" >> "$base/note"
    fi
    break
  done
  if [ "$mode" = loaded ]; then
    echo "the proxy's library was restored $(cat "$base"/run*/loads | grep -c '"OK"$' || true) times after tests removed it" >> "$base/note"
  fi
  # Verdicts of the last run; a test it skipped is SKIPPED if the mode skips
  # it, HANG if it is the one that hung, else its verdict from the latest
  # earlier run that reached it, else NOTRUN (it only shares its name with a
  # hung test).
  local st name v i
  while IFS=$'\t' read -r st name; do
    if [ "$st" = SKIP ]; then
      if printf '%s\n' "${fixed[@]+"${fixed[@]}"}" | grep -qxF "$name"; then
        st=SKIPPED
        echo "skipped in this mode: $name" >> "$base/note"
      elif cut -f1 "$base/hangs" | grep -qxF "$name"; then st=HANG
      elif ! cut -f1 "$base/hangs" | sed 's/ #[0-9]*$//' | grep -qxF "${name% #*}"; then
        continue  # not ours: --only leaves the other tests out this way
      else
        st=NOTRUN
        for ((i = n - 1; i >= 1; i--)); do
          v=$(awk -F '\t' -v x="$name" '$2 == x && $1 != "SKIP" { print $1; exit }' "$base/run$i/results")
          if [ -n "$v" ]; then st=$v; break; fi
        done
      fi
    fi
    printf '%s\t%s\n' "$st" "$name"
  done < "$base/run$n/results" > "$base/results"
  # A run stopped by MAX_HANGS never printed the hung tests as skipped.
  cut -f1 "$base/hangs" | while IFS= read -r name; do
    grep -qxF "HANG	$name" "$base/results" || printf 'HANG\t%s\n' "$name" >> "$base/results"
  done
  ln -sfn "run$n" "$base/last"
}

for unit in "${UNITS[@]}"; do
  for mode in "${MODES[@]}"; do
    runs_in "$unit" "$mode" && run_unit "$unit" "$mode"
  done
done

# --- report ----------------------------------------------------------------------
first_error_lines() { # base name
  local f
  for f in "$1"/last/errors/*.name; do
    [ -f "$f" ] || continue
    if [ "$(cat "$f")" = "$2" ]; then
      # The message, then from Tcl's stack only the statement of the test body
      # that raised it: the frames inside the suite's client code say nothing.
      awk '
        /^    while executing$/ { stack = 1; next }
        !stack && NF && shown < 5 { print; shown++; next }
        stack && /^    \("uplevel" body line [0-9]+\)$/ && !done {
          l = $0; sub(/^ *\("uplevel" body /, "", l); sub(/\)$/, "", l)
          print "at " l ": " prev; done = 1 }
        stack { prev = $0 }
      ' "${f%.name}" | sed 's/^/      /'
      return
    fi
  done
}

status=0
{
  echo "Redis $SOURCE_VERSION test units, plain redis-server vs ackproxy"
  echo "(singledb=$SINGLEDB, tags='${TAGS:-none}', logs: $RUN)"
  echo
  printf '%-16s %-10s %6s %6s %5s %7s\n' unit mode passed failed hung not-run
  for unit in "${UNITS[@]}"; do
    for mode in "${MODES[@]}"; do
      runs_in "$unit" "$mode" || continue
      r="$RUN/${unit//\//_}.$mode/results"
      printf '%-16s %-10s %6d %6d %5d %7d\n' "$unit" "$mode" \
        "$(grep -c '^PASS' "$r" || true)" "$(grep -c '^FAIL' "$r" || true)" \
        "$(grep -c '^HANG' "$r" || true)" "$(grep -c '^NOTRUN' "$r" || true)"
    done
  done
  for unit in "${UNITS[@]}"; do
    for mode in "${MODES[@]}"; do
      runs_in "$unit" "$mode" || continue
      base="$RUN/${unit//\//_}.$mode"
      if [ -s "$base/note" ]; then sed "s|^|note: $unit via $mode: |" "$base/note"; fi
      grep -v '^PASS' "$base/results" | sed "s|^\([A-Z]*\)\t|  $unit via $mode: \1 |" || true
    done
  done
  echo
  for unit in "${UNITS[@]}"; do
    d="$RUN/${unit//\//_}.direct/results"
    for mode in "${MODES[@]}"; do
      [ "$mode" = direct ] && continue
      runs_in "$unit" "$mode" || continue
      base="$RUN/${unit//\//_}.$mode"
      while IFS=$'\t' read -r st name; do
        [ "$st" = PASS ] || [ "$st" = SKIPPED ] && continue
        grep -qxF "PASS	$name" "$d" || continue
        # A test never run has no verdict; it is listed but fails nothing.
        [ "$st" = NOTRUN ] || status=1
        echo "DIFFERS $unit via $mode: $st: $name"
        if [ "$st" = HANG ]; then
          echo "      $(grep -F "$name	" "$base/hangs" | cut -f2 | head -1)"
        elif [ "$st" = NOTRUN ]; then
          echo "      skipped with the hung test of the same name"
        else
          first_error_lines "$base" "$name"
        fi
      done < "$base/results"
      # A run cut short (too many hangs, a crash) never reached these.
      awk -F '\t' 'NR == FNR { seen[$2] = 1; next } $1 == "PASS" && !seen[$2] { print $2 }' \
        "$base/results" "$d" | sed "s|^|DIFFERS $unit via $mode: NOTREACHED: |"
    done
  done
  [ "$status" = 0 ] && echo "No test passes directly and fails through the proxy."
} > "$FINDINGS"
cat "$FINDINGS"
exit "$status"
