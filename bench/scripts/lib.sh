# Shell helpers of the benchmark scripts (sourced; they set $out first).

# The processes a script starts: it appends their PIDs to `pids`, and they
# are killed (and waited for) when it exits, also on Ctrl-C. SIGKILL: a
# redis-server busy in a script ignores SIGTERM.
pids=()
stop_children() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap stop_children EXIT
trap 'exit 130' INT TERM

# Stops the script if process `pid` has died.
alive() { # pid name
  kill -0 "$1" 2>/dev/null || { echo "$2 died; see $out/$2.log" >&2; exit 1; }
}

# A loopback port nothing listens on, below the ephemeral range (the
# servers fail loudly if another process takes it first).
free_port() {
  local p
  while :; do
    p=$((10000 + RANDOM % 22000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}

# Waits until the server on `port` answers PING, for at most `tries` × 50
# ms (default 10 s); stops the script if it does not or `pid` dies.
wait_ping() { # port pid name [tries]
  for _ in $(seq "${4:-200}"); do
    [ "$(redis-cli -p "$1" ping 2>/dev/null)" = "PONG" ] && return 0
    kill -0 "$2" 2>/dev/null || break
    sleep 0.05
  done
  echo "$3 does not answer on port $1; see $out/$3.log" >&2
  exit 1
}
