#!/usr/bin/env python3
"""Jobs per second of real job frameworks through ackproxy against the same
framework straight on Redis, in one run, with the CPU each process spends
per job.

    python3 bench/scripts/framework_jobs.py [--framework rq|celery] [--jobs 2000]
        [--workers 2] [--rounds 3] [--ackproxy target/release/ackproxy]
        [--timeout S] [--commandstats] [--json] [--smoke]

Needs tests/frameworks/venv (bash tests/frameworks/setup.sh), redis-server
and a release build of ackproxy. Standard library only: the frameworks run
in the venv's processes.

Frameworks (both by default, one after the other), each as
tests/frameworks drives it:
  rq      one queue, its default; `rq worker --url URL default`, rq's
          default forking worker; config/frameworks/rq.toml.
  celery  Redis broker and result backend at the same URL, Celery's
          defaults (early ack, one prefork child per CPU, prefetch 4), no
          gossip, mingle or heartbeat (fw_celery.py's `early`);
          config/frameworks/celery.toml.
Jobs do nothing (no sleep, no side effect): what a run measures is what the
framework, Redis and the proxy spend per job.

For each framework a redis-server (`--save '' --appendonly no`) and an
ackproxy in front of it start on free loopback ports. Each round runs
direct, then through ackproxy: FLUSHALL, N jobs enqueued with the
framework's own API (not measured), W worker processes started; measured
from their start until all N jobs are done, then the workers are stopped.
CPU is utime + stime from /proc/PID/stat at both ends of that interval, of
redis-server, of ackproxy, and of every process of the worker trees
(cutime + cstime included, so that job processes that exited count too).
The same figures from the first job done on ("once running") leave out
the workers' start-up.

Output: one line per round, then per framework a table of medians (jobs/s,
CPU µs per job of Redis, proxy, workers) and the ratios through/direct.
--json prints the medians as one JSON line on stdout (the rest goes to
stderr). --commandstats adds the Redis commands per job, direct and through
ackproxy, from INFO commandstats. --smoke: one round of 200 jobs, both
frameworks; exit status 1 when any job was not done in time, a job failed
or a lease was left (as for any run).
"""

import argparse
import ctypes
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FRAMEWORKS_DIR = os.path.join(ROOT, "tests", "frameworks")
sys.dont_write_bytecode = True
sys.path.insert(0, FRAMEWORKS_DIR)

import jobkit  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
FRAMEWORKS = ("rq", "celery")
METRICS = ("jobs_s", "redis_us", "proxy_us", "workers_us", "total_us", "calls", "first_s",
           "run_jobs_s", "run_redis_us", "run_proxy_us", "run_workers_us")
# The harness polls Redis itself, never the proxy, so that a round through
# ackproxy and a direct one pay the same for it: one small command per
# poll, next to the tens of commands each job costs.
POLL_S = 0.02
STOP_WAIT_S = 5.0

OUT = sys.stdout


def say(msg=""):
    OUT.write(msg + "\n")
    OUT.flush()


def log(msg):
    sys.stderr.write("framework_jobs: %s\n" % msg)
    sys.stderr.flush()


class Failed(Exception):
    pass


# ------------------------------------------------------------------ Redis

class RedisError(Exception):
    pass


class Conn:
    """One RESP2 connection; counts the commands it sends, so that the
    harness's own can be told apart in INFO commandstats."""

    def __init__(self, port, timeout=30.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.f = self.sock.makefile("rb")
        self.sent = {}

    def call(self, *args):
        parts = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            parts.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.sock.sendall(b"".join(parts))
        name = str(args[0]).lower()
        self.sent[name] = self.sent.get(name, 0) + 1
        return self._read()

    def _read(self):
        line = self.f.readline()
        if not line.endswith(b"\r\n"):
            raise ConnectionError("connection closed")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RedisError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.f.read(n + 2)[:-2]
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._read() for _ in range(n)]
        raise RedisError("unexpected reply %r" % line)

    def close(self):
        try:
            self.f.close()
            self.sock.close()
        except OSError:
            pass


def info(conn, section):
    out = {}
    for line in conn.call("INFO", section).decode().splitlines():
        if ":" in line and not line.startswith("#"):
            k, v = line.split(":", 1)
            out[k] = v
    return out


def command_calls(conn):
    """command -> (calls, µs spent in it) so far, from INFO commandstats
    (commands that scripts and functions run included, their time in the
    FCALL's as well)."""
    calls = {}
    for k, v in info(conn, "commandstats").items():
        if k.startswith("cmdstat_"):
            f = dict(kv.split("=", 1) for kv in v.split(","))
            calls[k[len("cmdstat_"):]] = (int(f["calls"]), int(f["usec"]))
    return calls


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ping(port, proc, what, logpath):
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Failed("%s exited with status %s:\n%s" % (what, proc.returncode, tail(logpath)))
        try:
            c = Conn(port, timeout=2)
            try:
                if c.call("PING") == "PONG":
                    return
            finally:
                c.close()
        except (OSError, RedisError):
            pass
        time.sleep(0.05)
    raise Failed("%s did not answer PING on port %d:\n%s" % (what, port, tail(logpath)))


# -------------------------------------------------------------- processes

def stat_fields(pid):
    """The fields of /proc/PID/stat after the command name (which may hold
    spaces and parentheses): index 0 is field 3 (state)."""
    with open("/proc/%d/stat" % pid, "rb") as f:
        data = f.read()
    return data[data.rfind(b")") + 2:].split()


def cpu_s(pid, children=False):
    """utime + stime (fields 14, 15), with cutime + cstime (16, 17), what
    its waited-for children spent, when `children`."""
    f = stat_fields(pid)
    ticks = int(f[11]) + int(f[12])
    if children:
        ticks += int(f[13]) + int(f[14])
    return ticks / TICK


def proc_table():
    """pid -> (ppid, state) of every process in /proc."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                f = stat_fields(int(name))
                table[int(name)] = (int(f[1]), f[0].decode())
            except (OSError, IndexError, ValueError):
                pass
    return table


def descendants(roots, table=None):
    """`roots` and every process below them, through the ppid links."""
    table = proc_table() if table is None else table
    children = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found = {r for r in roots if r in table}
    stack = list(found)
    while stack:
        for c in children.get(stack.pop(), ()):
            if c not in found:
                found.add(c)
                stack.append(c)
    return found


def set_child_subreaper():
    """Orphans of the worker trees become this process's children instead
    of init's: their CPU then still shows (RUSAGE_CHILDREN once reaped),
    and the final sweep finds them."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


class Procs:
    """Every child started here, so that all of them go on exit."""

    def __init__(self):
        self.popens = []

    def start(self, argv, logpath, **kw):
        with open(logpath, "ab") as out:
            # A session of its own: a terminal's ^C reaches only this
            # script, which then stops everything in order.
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True, **kw)
        p.logpath = logpath
        self.popens.append(p)
        return p

    def reap_orphans(self):
        """Waits for exited processes that are this one's only as their
        subreaper (the Popen objects wait for their own)."""
        mine = {p.pid for p in self.popens}
        me = os.getpid()
        for pid, (ppid, state) in proc_table().items():
            if ppid == me and state == "Z" and pid not in mine:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass

    def stop(self, popens, sig_first=signal.SIGTERM, wait_s=STOP_WAIT_S):
        """`sig_first` to each of `popens`, SIGKILL after wait_s to whatever
        of their trees is left. The trees are collected first: once a root
        is gone its children no longer hang below it."""
        popens = [p for p in popens if p is not None]
        pids = descendants([p.pid for p in popens if p.poll() is None])
        for p in popens:
            if p.poll() is None:
                try:
                    p.send_signal(sig_first)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + wait_s
        while True:
            for p in popens:
                p.poll()
            self.reap_orphans()
            table = proc_table()
            alive = [q for q in pids | descendants(pids, table) if q in table and table[q][1] != "Z"]
            if not alive or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        for q in alive:
            try:
                os.kill(q, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for p in popens:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                log("pid %d survived SIGKILL" % p.pid)
        time.sleep(0.05)
        self.reap_orphans()
        self.popens = [p for p in self.popens if p not in popens]

    def stop_all(self):
        self.stop(list(reversed(self.popens)))
        # Whatever is left below this process (orphans of killed trees).
        me = os.getpid()
        rest = descendants([me]) - {me}
        for q in rest:
            try:
                os.kill(q, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if rest:
            time.sleep(0.1)
            self.reap_orphans()


def tail(path, lines=20):
    try:
        with open(path, "rb") as f:
            return b"".join(f.readlines()[-lines:]).decode(errors="replace")
    except OSError:
        return ""


# ------------------------------------------------------------- frameworks

# The job rq runs: bench/scripts/framework_noop.py's noop (on the workers' path).
RQ_ENQUEUE = """
import sys
from redis import Redis
from rq import Queue
q = Queue("default", connection=Redis.from_url(sys.argv[1]))
for _ in range(int(sys.argv[2])):
    q.enqueue("framework_noop.noop")
"""

# Celery needs its task registered in an app both sides import: a module
# written into the run's temporary directory, so that nothing of a run
# lands in the source tree.
CELERY_MODULE = "framework_jobs_celery"
CELERY_APP = '''import os

from celery import Celery

URL = os.environ["FRAMEWORK_JOBS_URL"]
app = Celery("framework_jobs_celery", broker=URL, backend=URL)
app.conf.broker_connection_retry_on_startup = True


@app.task(name="noop")
def noop():
    return None
'''

CELERY_ENQUEUE = """
import sys
from framework_jobs_celery import noop
ids = [noop.delay().id for _ in range(int(sys.argv[1]))]
sys.stdout.write("\\n".join(ids) + "\\n")
"""


class Framework:
    def __init__(self, name, tmp):
        self.name = name
        self.tmp = tmp
        self.config = os.path.join(ROOT, "config", "frameworks", name + ".toml")
        self.queue = "rq:queue:default" if name == "rq" else "celery"
        if name == "celery":
            with open(os.path.join(tmp, CELERY_MODULE + ".py"), "w") as f:
                f.write(CELERY_APP)
        self.ids = []

    def env(self, url):
        env = dict(os.environ)
        path = os.environ.get("PYTHONPATH")
        env.update({
            "PYTHONPATH": os.pathsep.join([self.tmp, HERE] + ([path] if path else [])),
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "FRAMEWORK_JOBS_URL": url,
        })
        return env

    def enqueue(self, url, n):
        if self.name == "rq":
            argv = [jobkit.VENV_PY, "-c", RQ_ENQUEUE, url, str(n)]
        else:
            argv = [jobkit.VENV_PY, "-c", CELERY_ENQUEUE, str(n)]
        r = subprocess.run(argv, cwd=self.tmp, env=self.env(url), stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
        if r.returncode != 0:
            raise Failed("%s enqueue failed (exit %d):\n%s" % (self.name, r.returncode,
                                                              r.stderr.decode(errors="replace")[-3000:]))
        self.ids = r.stdout.decode().split()
        if self.name == "celery" and len(self.ids) != n:
            raise Failed("celery enqueue gave %d task ids for %d tasks" % (len(self.ids), n))

    def worker_argv(self, url, k):
        if self.name == "rq":
            return [os.path.join(jobkit.VENV, "bin", "rq"), "worker", "--url", url, "default"]
        return [os.path.join(jobkit.VENV, "bin", "celery"), "-A", CELERY_MODULE, "worker",
                "--loglevel=INFO", "--without-gossip", "--without-mingle", "--without-heartbeat",
                "-n", "bench%d@%%h" % k]


class Progress:
    """How many jobs are done, read straight from Redis with as little as
    possible: the cheapest record of a job's end that the framework writes
    anyway, so that the jobs themselves stay empty.

    rq: ZCARD rq:finished:default, O(1): rq adds each job there when it
    ends (the very write that acknowledges its lease through ackproxy).
    Celery: no counter of its own, and counting result keys takes a SCAN of
    the whole keyspace per poll. Tasks are taken in enqueue order (LPUSH,
    BRPOP), so the harness watches one result key (EXISTS
    celery-task-meta-<id>: the first task's, then the last's), and only
    once the last one is there asks for all N at once (one EXISTS)."""

    def __init__(self, fw, conn, n):
        self.fw, self.conn, self.n = fw, conn, n
        self.keys = ["celery-task-meta-" + i for i in fw.ids]
        self.first_seen = False
        self.last_seen = False

    def poll(self):
        """(any job done, all jobs done)."""
        if self.fw.name == "rq":
            done = self.conn.call("ZCARD", "rq:finished:default")
            return done > 0, done >= self.n
        if not self.first_seen:
            self.first_seen = self.conn.call("EXISTS", self.keys[0]) == 1
            return self.first_seen, False
        if not self.last_seen:
            self.last_seen = self.conn.call("EXISTS", self.keys[-1]) == 1
            if not self.last_seen:
                return True, False
        return True, self.done() >= self.n

    def done(self):
        if self.fw.name == "rq":
            return self.conn.call("ZCARD", "rq:finished:default")
        return self.conn.call("EXISTS", *self.keys)

    def failed(self):
        """Jobs the framework recorded as failed."""
        if self.fw.name == "rq":
            return self.conn.call("ZCARD", "rq:failed:default")
        bad = [v for v in self.conn.call("MGET", *self.keys) if b'"SUCCESS"' not in (v or b"")]
        if bad:
            return "%d tasks, e.g. result %s" % (len(bad), (bad[0] or b"none")[:200].decode(errors="replace"))
        return 0


# ------------------------------------------------------------------ rounds

def worker_cpu_s(roots):
    """CPU of the worker trees so far: each live process's own and what
    its exited, waited-for children spent."""
    total = 0.0
    for pid in descendants(roots):
        try:
            total += cpu_s(pid, children=True)
        except (OSError, IndexError, ValueError):
            pass
    return total


def reaped_cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def one_round(a, fw, procs, env, mode, target_port, timeout):
    rconn = env["rconn"]
    rconn.call("FLUSHALL")
    url = "redis://127.0.0.1:%d/0" % target_port
    fw.enqueue(url, a.jobs)
    progress = Progress(fw, rconn, a.jobs)

    redis_pid, proxy_pid = env["redis"].pid, env["proxy"].pid
    calls0 = command_calls(rconn)
    rconn.sent = {}
    r0, p0 = cpu_s(redis_pid), cpu_s(proxy_pid)
    procs.reap_orphans()
    c0 = reaped_cpu_s()
    t0 = time.monotonic()
    workers = [procs.start(fw.worker_argv(url, k),
                           os.path.join(fw.tmp, "%s-worker-%d.log" % (mode, k)),
                           cwd=fw.tmp, env=fw.env(url))
               for k in range(a.workers)]
    roots = [w.pid for w in workers]
    # A second snapshot when the first job is seen done: the interval from
    # there on leaves out the workers' start-up (imports, registration,
    # Celery's pool), which is no per-job cost.
    first = None
    deadline = t0 + timeout
    next_check = t0 + 1.0
    try:
        while True:
            any_done, all_done = progress.poll()
            now = time.monotonic()
            if any_done and first is None:
                first = {"t": now, "done": progress.done(), "w": worker_cpu_s(roots),
                         "r": cpu_s(redis_pid), "p": cpu_s(proxy_pid), "c": reaped_cpu_s()}
            if all_done:
                break
            if now >= deadline:
                raise Failed("%s %s: %d of %d jobs done after %.0f s; last lines of %s:\n%s"
                             % (fw.name, mode, progress.done(), a.jobs, timeout,
                                workers[0].logpath, tail(workers[0].logpath)))
            if now >= next_check:
                next_check = now + 1.0
                for w in workers:
                    if w.poll() is not None:
                        raise Failed("%s %s: a worker exited (status %s); last lines of %s:\n%s"
                                     % (fw.name, mode, w.returncode, w.logpath, tail(w.logpath)))
            time.sleep(POLL_S)
        t1 = time.monotonic()
        elapsed = t1 - t0
        wcpu = worker_cpu_s(roots)
        r1, p1 = cpu_s(redis_pid), cpu_s(proxy_pid)
        procs.reap_orphans()
        c1 = reaped_cpu_s()
        calls1 = command_calls(rconn)
        harness = dict(rconn.sent)
    finally:
        procs.stop(workers)

    problems = []
    failed = progress.failed()
    if failed:
        problems.append("failed jobs: %s" % failed)
    if mode == "ackproxy":
        # Through ackproxy every job's lease must have been acknowledged by
        # the framework's own record of its end; that write may still be on
        # its way when the count is reached.
        pconn = Conn(target_port)
        try:
            for _ in range(100):
                q = pconn.call("QUEUE", "INFO", fw.queue)
                q = dict(zip((k.decode() for k in q[0::2]), q[1::2]))
                if int(q["leased"]) == 0:
                    break
                time.sleep(0.05)
        finally:
            pconn.close()
        if int(q["leased"]) != 0 or int(q["ready"]) != 0:
            problems.append("queue %s: leased %s, ready %s" % (fw.queue, q["leased"], q["ready"]))

    # Redis's own commands per job, less what the harness sent (calls; the
    # harness's few small commands add little to the time).
    delta = {}
    for k, (n, us) in calls1.items():
        n0, us0 = calls0.get(k, (0, 0))
        d = n - n0 - harness.get(k, 0)
        if d > 0 and k != "info":
            delta[k] = (d, us - us0)
    per = 1e6 / a.jobs
    m = {
        "jobs_s": a.jobs / elapsed,
        "redis_us": (r1 - r0) * per,
        "proxy_us": (p1 - p0) * per,
        "workers_us": (wcpu + c1 - c0) * per,
        "calls": sum(n for n, _ in delta.values()) / a.jobs,
    }
    m["total_us"] = m["redis_us"] + m["proxy_us"] + m["workers_us"]
    rest = a.jobs - first["done"]
    m["first_s"] = first["t"] - t0
    if rest > 0 and t1 > first["t"]:
        per = 1e6 / rest
        m["run_jobs_s"] = rest / (t1 - first["t"])
        m["run_redis_us"] = (r1 - first["r"]) * per
        m["run_proxy_us"] = (p1 - first["p"]) * per
        m["run_workers_us"] = (wcpu + c1 - first["w"] - first["c"]) * per
    else:
        m.update(run_jobs_s=m["jobs_s"], run_redis_us=m["redis_us"], run_proxy_us=m["proxy_us"],
                 run_workers_us=m["workers_us"])
    return m, delta, problems


def start_servers(a, fw, procs):
    redis_port, proxy_port = free_port(), free_port()
    redis = procs.start(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
                         "--save", "", "--appendonly", "no", "--dir", fw.tmp],
                        os.path.join(fw.tmp, "redis.log"))
    wait_ping(redis_port, redis, "redis-server", redis.logpath)
    proxy = procs.start([a.ackproxy, "--config", fw.config, "--listen", "127.0.0.1:%d" % proxy_port,
                         "--upstream", "127.0.0.1:%d" % redis_port],
                        os.path.join(fw.tmp, "ackproxy.log"))
    wait_ping(proxy_port, proxy, "ackproxy", proxy.logpath)
    return {"redis": redis, "proxy": proxy, "redis_port": redis_port, "proxy_port": proxy_port,
            "rconn": Conn(redis_port)}


def fmt_round(fw, r, mode, m):
    return ("%-6s round %d %-8s %6.1f jobs/s, CPU µs/job: redis %6.1f, proxy %6.1f, workers %7.0f; "
            "Redis calls/job %4.1f | first job done after %.2f s, from there %6.1f jobs/s, "
            "CPU µs/job: redis %6.1f, proxy %6.1f, workers %7.0f"
            % (fw, r, mode, m["jobs_s"], m["redis_us"], m["proxy_us"], m["workers_us"], m["calls"],
               m["first_s"], m["run_jobs_s"], m["run_redis_us"], m["run_proxy_us"], m["run_workers_us"]))


def run_framework(a, name, procs, tmp, versions):
    fw = Framework(name, tmp)
    timeout = a.timeout if a.timeout else 60.0 + 0.2 * a.jobs
    env = start_servers(a, fw, procs)
    runs = {"direct": [], "ackproxy": []}
    stats = {"direct": {}, "ackproxy": {}}
    problems = []
    say("%s %s, %d no-op jobs, %d worker processes, %d round(s), direct and through ackproxy "
        "(%s) interleaved" % (name, versions.get(name, "?"), a.jobs, a.workers, a.rounds,
                              os.path.relpath(fw.config, ROOT)))
    try:
        for r in range(1, a.rounds + 1):
            for mode, port in (("direct", env["redis_port"]), ("ackproxy", env["proxy_port"])):
                m, delta, bad = one_round(a, fw, procs, env, mode, port, timeout)
                runs[mode].append(m)
                for k, (n, us) in delta.items():
                    c, t = stats[mode].get(k, (0, 0))
                    stats[mode][k] = (c + n, t + us)
                problems += ["%s round %d %s: %s" % (name, r, mode, b) for b in bad]
                say(fmt_round(name, r, mode, m) + ("  FAILED: " + "; ".join(bad) if bad else ""))
    finally:
        env["rconn"].close()
        procs.stop([env["proxy"], env["redis"]])

    med = {mode: {k: statistics.median(x[k] for x in v) for k in METRICS} for mode, v in runs.items()}
    d, p = med["direct"], med["ackproxy"]
    ratio = {k: (p[k] / d[k] if d[k] else None) for k in METRICS if k not in ("proxy_us", "run_proxy_us")}
    med["ratio"] = ratio

    def x(v):
        return "–" if v is None else "%.2f×" % v

    say()
    say("%s, medians of %d round(s); CPU µs per job; \"once running\": from the first job done on"
        % (name, a.rounds))
    say()
    say("| %s | jobs/s | Redis | proxy | workers | total | Redis calls/job "
        "| once running: jobs/s | Redis | proxy | workers |" % name)
    say("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for mode in ("direct", "ackproxy"):
        m = med[mode]
        say("| %s | %.1f | %.1f | %.1f | %.0f | %.0f | %.1f | %.1f | %.1f | %.1f | %.0f |"
            % (mode, m["jobs_s"], m["redis_us"], m["proxy_us"], m["workers_us"], m["total_us"],
               m["calls"], m["run_jobs_s"], m["run_redis_us"], m["run_proxy_us"], m["run_workers_us"]))
    say("| through/direct | %s | %s | – | %s | %s | %s | %s | %s | – | %s |"
        % tuple(x(ratio[k]) for k in ("jobs_s", "redis_us", "workers_us", "total_us", "calls",
                                       "run_jobs_s", "run_redis_us", "run_workers_us")))
    say()

    if a.commandstats:
        n = a.jobs * a.rounds
        zero = (0, 0)

        def row(label, dv, pv):
            say("| %s | %.2f | %.2f | %.1f | %.1f |" % (label, dv[0] / n, pv[0] / n, dv[1] / n, pv[1] / n))

        names = sorted(set(stats["direct"]) | set(stats["ackproxy"]),
                       key=lambda k: (-(stats["ackproxy"].get(k, zero)[0] + stats["direct"].get(k, zero)[0]), k))
        say("%s: Redis commands per job, INFO commandstats over the measured intervals of all rounds "
            "(commands run by functions counted as well; their time is also inside FCALL's)" % name)
        say()
        say("| command | calls/job direct | calls/job ackproxy | µs/job direct | µs/job ackproxy |")
        say("|---|---:|---:|---:|---:|")
        other = {"direct": [0, 0], "ackproxy": [0, 0]}
        for k in names:
            dv, pv = stats["direct"].get(k, zero), stats["ackproxy"].get(k, zero)
            if max(dv[0], pv[0]) < 0.05 * n:
                for mode, v in (("direct", dv), ("ackproxy", pv)):
                    other[mode][0] += v[0]
                    other[mode][1] += v[1]
            else:
                row(k, dv, pv)
        row("others (each < 0.05 a job)", other["direct"], other["ackproxy"])
        say("| all calls | %.2f | %.2f | | |" % tuple(sum(c for c, _ in stats[m].values()) / n
                                                   for m in ("direct", "ackproxy")))
        say()
    return med, problems


def versions_of(names):
    code = ("import importlib.metadata as m, sys\n"
            "print(' '.join('%s=%s' % (n, m.version(n)) for n in sys.argv[1:]))")
    r = subprocess.run([jobkit.VENV_PY, "-c", code] + list(names), stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, timeout=60)
    out = {}
    for item in r.stdout.decode().split():
        k, v = item.split("=", 1)
        out[k] = v
    return out


def main():
    global OUT
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--framework", choices=FRAMEWORKS, help="one framework (default: both)")
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ackproxy", default=os.path.join(ROOT, "target", "release", "ackproxy"))
    ap.add_argument("--timeout", type=float, help="seconds a round may take (default 60 + 0.2 per job)")
    ap.add_argument("--commandstats", action="store_true", help="Redis commands per job, by command")
    ap.add_argument("--json", action="store_true", help="the medians as one JSON line on stdout")
    ap.add_argument("--smoke", action="store_true", help="1 round of 200 jobs, both frameworks")
    a = ap.parse_args()
    if a.smoke:
        a.jobs, a.rounds, a.framework = 200, 1, None
    if a.jobs < 1 or a.workers < 1 or a.rounds < 1:
        ap.error("--jobs, --workers and --rounds must be >= 1")
    names = [a.framework] if a.framework else list(FRAMEWORKS)
    if a.json:
        OUT = sys.stderr

    def on_signal(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    set_child_subreaper()

    procs = Procs()
    tmp = tempfile.mkdtemp(prefix="ackproxy-framework-jobs-")
    code = 0
    try:
        if not os.access(a.ackproxy, os.X_OK):
            raise Failed("no ackproxy binary at %s (cargo build --release, or --ackproxy BIN)" % a.ackproxy)
        for name in names:
            try:
                jobkit.venv_ready(*(("rq", "redis") if name == "rq" else ("celery", "kombu.transport.redis")))
            except RuntimeError as e:
                raise Failed(str(e))
        versions = versions_of(["rq", "celery", "kombu", "redis"])
        load = open("/proc/loadavg").read().split()[:3]
        say("%s UTC; %d cores; load average before: %s; %s; redis-py %s"
            % (time.strftime("%Y-%m-%d %H:%M", time.gmtime()), os.cpu_count(), " ".join(load),
               subprocess.run([a.ackproxy, "--version"], stdout=subprocess.PIPE).stdout.decode().strip(),
               versions.get("redis", "?")))
        versions["celery"] = "%s (kombu %s)" % (versions.get("celery", "?"), versions.get("kombu", "?"))
        result = {}
        problems = []
        for name in names:
            d = os.path.join(tmp, name)
            os.makedirs(d)
            result[name], bad = run_framework(a, name, procs, d, versions)
            problems += bad
        if a.json:
            sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
            sys.stdout.flush()
        if problems:
            for p in problems:
                log(p)
            code = 1
    except Failed as e:
        log(str(e))
        code = 1
    except KeyboardInterrupt:
        log("interrupted")
        code = 130
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
        log("stopped (exit status %s)" % code)
    except Exception:  # noqa: BLE001 - reported, and everything still stopped
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        procs.stop_all()
        if code == 0:
            subprocess.run(["rm", "-rf", tmp])
        else:
            log("logs kept in %s" % tmp)
    return code


if __name__ == "__main__":
    sys.exit(main())
