#!/usr/bin/env python3
"""Instructions, allocations and system calls the proxy spends per request
and per pop+ACK pair, counted rather than timed, so the figures repeat
whatever else the machine is doing.

The proxy (ACKPROXY_BIN, default target/release/ackproxy) runs under
valgrind's callgrind in front of a plain redis-server; the load comes from
separate processes, and the counters are zeroed after a warm-up and dumped
after the measured stream, so start-up is left out. Workloads:

  get, set   redis-benchmark -c 50 -n N -t get|set -P 1 (no pipelining)
  get16, set16  the same, 16 requests in flight per connection (-P 16)
  pairs      50 connections, closed loop, no pipelining: RPOP jobs, the
             id from the JSON message, ACK jobs id (rule ack_id = json:id;
             128 B messages {"id":"<12 digits>","body":"x..."}, pushed
             straight into Redis beforehand)
  pairs16    10 connections, each pipelining 16 RPOPs, then the 16 ACKs
  bpairs     as pairs, with BRPOP jobs 1 for the pop

For each: instructions per request (pair), calls of malloc/realloc/calloc
per request (pair), and, with --strace, system calls per request (pair)
from `strace -c -f` attached to the proxy (not under valgrind) for the
same stream.

Usage: python3 bench/scripts/proxy_instructions.py [-n N] [--pairs N] [--tests get,set,get16,set16,pairs,pairs16]
         [--threads T] [--db D] [--strace] [--keep DIR]
  -n N        requests per get/set test (default 20000)
  --pairs N   pairs per pairs test (default 5000)
  --db D      every client SELECTs database D first (default 0): queue
              calls outside database 0 take the functions' `_db_` variants
  --keep DIR  keeps the callgrind dumps there (for callgrind_annotate)
Needs: redis-server, redis-benchmark, valgrind (callgrind_control), strace.
"""
import argparse
import glob
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = '[[queue]]\npattern = "jobs"\nack_id = "json:id"\n'
CONNS = 50
WARM = 2000
WARM_PAIRS = 500


def enc(args):
    args = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def message(i):
    return b'{"id":"%012d","body":"%s"}' % (i, b"x" * (128 - 31))


class Conn:
    """A blocking client, for set-up."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.buf = b""

    def _line(self):
        while b"\r\n" not in self.buf:
            chunk = self.s.recv(1 << 20)
            if not chunk:
                raise EOFError
            self.buf += chunk
        i = self.buf.index(b"\r\n")
        line, self.buf = self.buf[:i], self.buf[i + 2:]
        return line

    def read(self):
        line = self._line()
        t = line[:1]
        if t in b"+-:":
            return line
        if t == b"$":
            n = int(line[1:])
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self.buf += self.s.recv(1 << 20)
            d, self.buf = self.buf[:n], self.buf[n + 2:]
            return d
        if t == b"*":
            n = int(line[1:])
            return None if n < 0 else [self.read() for _ in range(n)]
        raise ValueError(line)

    def cmd(self, *args):
        self.s.sendall(enc(args))
        return self.read()


def wait_conn(port, proc, tries=1200):
    for _ in range(tries):
        if proc.poll() is not None:
            sys.exit(f"process on port {port} exited")
        try:
            c = Conn(port)
            if c.cmd("PING") == b"+PONG":
                return c
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit(f"nothing answers on port {port}")


def split_replies(buf, want):
    """Up to `want` whole bulk/simple replies at the front of `buf`:
    (replies, bytes used)."""
    out, at = [], 0
    while len(out) < want:
        end = buf.find(b"\r\n", at)
        if end < 0:
            break
        t = buf[at:at + 1]
        if t == b"*" and buf[at + 1:end] == b"2":
            # BRPOP's [key, message]: the message stands for the reply.
            inner, used = split_replies(buf[end + 2:], 2)
            if len(inner) < 2:
                break
            out.append(inner[1])
            at = end + 2 + used
            continue
        if t == b"$":
            n = int(buf[at + 1:end])
            if n < 0:
                out.append(None)
                at = end + 2
                continue
            if len(buf) < end + 2 + n + 2:
                break
            out.append(buf[end + 2:end + 2 + n])
            at = end + 2 + n + 2
        else:
            out.append(buf[at:end])
            at = end + 2
    return out, at


def json_id(msg):
    m = re.search(rb'"id":"([^"]*)"', msg)
    return m.group(1)


def pairs(port, total, conns, depth, db, pop):
    """`total` pop+ACK pairs over `conns` connections (in database `db`),
    each with `depth` pops in flight, then their ACKs: returns the number of
    error replies."""
    sel = selectors.DefaultSelector()
    per = [total // conns + (1 if i < total % conns else 0) for i in range(conns)]
    state = {}
    for i in range(conns):
        if per[i] == 0:
            continue
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if db:
            s.sendall(enc(["SELECT", db]))
            if s.recv(64) != b"+OK\r\n":
                sys.exit(f"SELECT {db} refused")
        st = {"left": per[i], "buf": b"", "want": 0, "phase": "pop", "s": s}
        state[s.fileno()] = st
        sel.register(s, selectors.EVENT_READ, st)
        send_pops(st, depth, pop)
    errors = 0
    while state:
        for key, _ in sel.select(timeout=120):
            st = key.data
            chunk = st["s"].recv(1 << 16)
            if not chunk:
                sys.exit("proxy closed a connection")
            st["buf"] += chunk
            got, used = split_replies(st["buf"], st["want"])
            if len(got) < st["want"]:
                continue
            st["buf"] = st["buf"][used:]
            if st["phase"] == "pop":
                ids = []
                for r in got:
                    if r is None or r.startswith(b"-"):
                        errors += 1
                    else:
                        ids.append(json_id(r))
                if ids:
                    st["s"].sendall(b"".join(enc(["ACK", "jobs", i]) for i in ids))
                    st["want"], st["phase"] = len(ids), "ack"
                    continue
            else:
                errors += sum(1 for r in got if r != b":1")
            if st["left"] == 0:
                sel.unregister(st["s"])
                st["s"].close()
                del state[key.fd]
            else:
                send_pops(st, depth, pop)
    return errors


def send_pops(st, depth, pop):
    n = min(depth, st["left"])
    st["left"] -= n
    st["s"].sendall(enc(pop) * n)
    st["want"], st["phase"] = n, "pop"


def push(redis, first, count):
    for i in range(first, first + count, 1000):
        redis.cmd("LPUSH", "jobs", *[message(j) for j in range(i, min(first + count, i + 1000))])


def load(test, port, count, first, db):
    """Runs `count` requests (pairs) of `test` against the proxy."""
    if test in ("get", "set", "get16", "set16"):
        select = ["--dbnum", str(db)] if db else []
        subprocess.run(["redis-benchmark", "-p", str(port), "-c", str(CONNS), "-n", str(count),
                        "-t", test[:3], "-P", "16" if test.endswith("16") else "1", "-r", "1000",
                        "-q"] + select,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        return 0
    conns, depth = (10, 16) if test == "pairs16" else (CONNS, 1)
    pop = ["BRPOP", "jobs", "1"] if test == "bpairs" else ["RPOP", "jobs"]
    return pairs(port, count, conns, depth, db, pop)


def start_proxy(binary, tmp, redis_port, threads, wrap):
    port = free_port()
    cfg = os.path.join(tmp, "ackproxy.toml")
    with open(cfg, "w") as f:
        f.write(CONFIG)
    cmd = wrap + [binary, "--listen", f"127.0.0.1:{port}", "--upstream", f"127.0.0.1:{redis_port}",
                  "--config", cfg, "--threads", str(threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, RUST_LOG="warn"))
    return proc, port


def callgrind_totals(path):
    """Total instructions, and calls of each allocation function."""
    total = 0
    names = {}
    calls = {"malloc": 0, "realloc": 0, "calloc": 0, "free": 0}
    cfn = None
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                total = max(total, int(line.split()[1]))
            elif line.startswith(("fn=", "cfn=")):
                # Names are compressed: "(id) name" the first time, in
                # either kind of line, "(id)" after.
                m = re.match(r"c?fn=\((\d+)\)(?: (.*))?", line.strip())
                if m:
                    if m.group(2):
                        names[m.group(1)] = m.group(2)
                    cfn = names.get(m.group(1)) if line.startswith("cfn=") else None
            elif line.startswith("calls=") and cfn is not None:
                base = cfn.split("'")[0]
                if base in calls:
                    calls[base] += int(line.split()[0][6:])
                cfn = None
    return total, calls


def measure(test, binary, tmp, redis, redis_port, n, threads, keep, db):
    out = os.path.join(tmp, f"callgrind.{test}")
    proxy, port = start_proxy(binary, tmp, redis_port, threads,
                              ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p"])
    try:
        wait_conn(port, proxy)
        pairs_test = test in ("pairs", "pairs16", "bpairs")
        warm = WARM_PAIRS if pairs_test else WARM
        if pairs_test:
            redis.cmd("DEL", "jobs")
            push(redis, 0, warm + n)
        load(test, port, warm, 0, db)
        subprocess.run(["callgrind_control", "-z", str(proxy.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        errors = load(test, port, n, warm, db)
        subprocess.run(["callgrind_control", "-d", str(proxy.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        time.sleep(0.5)
        dump = sorted(glob.glob(out + ".*"), key=os.path.getmtime)[-1]
        total, calls = callgrind_totals(dump)
        if keep:
            os.makedirs(keep, exist_ok=True)
            shutil.copy(dump, os.path.join(keep, f"callgrind.{test}"))
        return total, calls, errors
    finally:
        proxy.kill()
        proxy.wait()


def syscalls(test, binary, tmp, redis, redis_port, n, threads, db):
    """System calls of the proxy for the same stream, by name."""
    proxy, port = start_proxy(binary, tmp, redis_port, threads, [])
    try:
        wait_conn(port, proxy)
        pairs_test = test in ("pairs", "pairs16", "bpairs")
        warm = WARM_PAIRS if pairs_test else WARM
        if pairs_test:
            redis.cmd("DEL", "jobs")
            push(redis, 0, warm + n)
        load(test, port, warm, 0, db)
        report = os.path.join(tmp, f"strace.{test}")
        tracer = subprocess.Popen(["strace", "-c", "-f", "-o", report, "-p", str(proxy.pid)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # attached to every thread
        load(test, port, n, warm, db)
        tracer.send_signal(signal.SIGINT)
        tracer.wait()
        counts = {}
        with open(report) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
                    counts[parts[-1]] = int(parts[3])
        return counts
    finally:
        proxy.kill()
        proxy.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=20000)
    ap.add_argument("--pairs", type=int, default=5000)
    ap.add_argument("--tests", default="get,set,pairs,pairs16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--db", type=int, default=0)
    ap.add_argument("--strace", action="store_true")
    ap.add_argument("--keep")
    a = ap.parse_args()
    for tool in ("redis-server", "redis-benchmark", "valgrind", "callgrind_control") + (("strace",) if a.strace else ()):
        if not shutil.which(tool):
            sys.exit(f"{tool} is missing")
    binary = os.environ.get("ACKPROXY_BIN", os.path.join(HERE, "..", "..", "target", "release", "ackproxy"))
    with tempfile.TemporaryDirectory() as tmp:
        rport = free_port()
        rproc = subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no", "--dir", tmp],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            redis = wait_conn(rport, rproc)
            if a.db:
                # The set-up's DEL and LPUSH go to the clients' database.
                redis.cmd("SELECT", a.db)
            print(f"binary: {binary}; threads: {a.threads}; database: {a.db}")
            print("| test | measured | Ir total | Ir each | malloc each | realloc each | free each | errors |"
                  + (" syscalls each | by name (each) |" if a.strace else ""))
            print("|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---|" if a.strace else ""))
            for test in a.tests.split(","):
                n = a.pairs if test in ("pairs", "pairs16", "bpairs") else a.n
                total, calls, errors = measure(test, binary, tmp, redis, rport, n, a.threads, a.keep, a.db)
                row = (f"| {test} | {n} | {total:,} | {total / n:,.0f} | {calls['malloc'] / n:.2f} "
                       f"| {calls['realloc'] / n:.2f} | {calls['free'] / n:.2f} | {errors} |")
                if a.strace:
                    counts = syscalls(test, binary, tmp, redis, rport, n, a.threads, a.db)
                    shown = sorted(counts.items(), key=lambda kv: -kv[1])[:6]
                    row += (f" {sum(counts.values()) / n:.2f} | "
                            + ", ".join(f"{k} {v / n:.2f}" for k, v in shown) + " |")
                print(row, flush=True)
        finally:
            rproc.kill()
            rproc.wait()


if __name__ == "__main__":
    main()
