#!/usr/bin/env python3
"""Jobs per second of a real job framework (rq, one queue, its default
worker) through ackproxy with config/frameworks/rq.toml, against the same
framework straight on Redis, in one run, with the CPU each process spends
per job.

    python3 bench/framework_jobs.py [--jobs 2000] [--workers 2] [--rounds 3]
        [--ackproxy target/release/ackproxy] [--smoke]

Each round, direct Redis and then ackproxy: FLUSHALL, N no-op jobs enqueued
with rq's own API (not measured), then W `rq worker --burst` processes
started and waited for (they exit once the queue is empty). Measured from
their start to the last one's exit: wall time, and CPU (utime + stime) of
redis-server and ackproxy from /proc/PID/stat, and of the workers with
their forked job processes (the children this process reaped). Through
ackproxy every job's lease must be acknowledged by rq's own finish
(`ZADD rq:finished:default`), which is checked. Prints each round, then
the medians and the ratios through/direct.

Needs tests/frameworks/venv (bash tests/frameworks/setup.sh) and a release
build of ackproxy. --smoke: one round of 200 jobs; exit status 1 if any job
was not done or a lease was left.
"""

import argparse
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
ROOT = os.path.dirname(HERE)
VENV = os.path.join(ROOT, "tests", "frameworks", "venv", "bin")
TICK = os.sysconf("SC_CLK_TCK")
CHILDREN = []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cmd(port, *args):
    """One command with redis-cli; its output stripped."""
    out = subprocess.run(["redis-cli", "-p", str(port), *map(str, args)],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def wait_ping(port, proc, what):
    deadline = time.time() + 20
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what} exited with {proc.returncode}")
        try:
            if cmd(port, "PING") == "PONG":
                return
        except subprocess.CalledProcessError:
            pass
        time.sleep(0.05)
    sys.exit(f"{what} did not answer PING on {port}")


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime and stime: fields 14 and 15 of stat, 12 and 13 after the name.
    return (int(fields[11]) + int(fields[12])) / TICK


def children_cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def start(argv, **kw):
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, **kw)
    CHILDREN.append(p)
    return p


def stop_all(*_):
    for p in CHILDREN:
        if p.poll() is None:
            p.terminate()
    deadline = time.time() + 5
    for p in CHILDREN:
        try:
            p.wait(max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


ENQUEUE = """
import sys
from redis import Redis
from rq import Queue
q = Queue(connection=Redis.from_url(sys.argv[1]))
for _ in range(int(sys.argv[2])):
    q.enqueue("framework_noop.noop")
"""


def one_round(target_port, redis_port, proxy, jobs, workers):
    cmd(redis_port, "FLUSHALL")
    url = f"redis://127.0.0.1:{target_port}/0"
    env = dict(os.environ, PYTHONPATH=HERE)
    subprocess.run([os.path.join(VENV, "python"), "-c", ENQUEUE, url, str(jobs)],
                   env=env, check=True)
    redis_pid = int(cmd(redis_port, "INFO", "server").split("process_id:")[1].split()[0])
    r0, c0 = cpu_s(redis_pid), children_cpu_s()
    p0 = cpu_s(proxy.pid) if proxy and target_port != redis_port else 0.0
    t0 = time.monotonic()
    procs = [start([os.path.join(VENV, "rq"), "worker", "--burst", "--url", url,
                    "--logging_level", "WARNING"], env=env, cwd=HERE)
             for _ in range(workers)]
    for p in procs:
        p.wait()
    elapsed = time.monotonic() - t0
    r1, c1 = cpu_s(redis_pid), children_cpu_s()
    p1 = cpu_s(proxy.pid) if proxy and target_port != redis_port else 0.0
    done = int(cmd(redis_port, "ZCARD", "rq:finished:default") or 0)
    leased = None
    if target_port != redis_port:
        # Signals are acknowledged just after rq's finish: give them a moment.
        for _ in range(100):
            info = cmd(target_port, "QUEUE", "INFO", "rq:queue:default").split()
            leased = int(info[info.index("leased") + 1])
            if leased == 0:
                break
            time.sleep(0.05)
    us = 1e6 / jobs
    return {
        "jobs_s": jobs / elapsed,
        "redis_us": (r1 - r0) * us,
        "proxy_us": (p1 - p0) * us,
        "workers_us": (c1 - c0) * us,
        "done": done,
        "leased": leased,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ackproxy", default=os.path.join(ROOT, "target", "release", "ackproxy"))
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        a.jobs, a.rounds = 200, 1
    if not os.path.exists(os.path.join(VENV, "rq")):
        sys.exit("rq is not installed: bash tests/frameworks/setup.sh")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    tmp = tempfile.mkdtemp(prefix="ackproxy-framework-jobs-")
    redis_port, proxy_port = free_port(), free_port()
    try:
        redis = start(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
                       "--save", "", "--appendonly", "no", "--dir", tmp])
        wait_ping(redis_port, redis, "redis-server")
        proxy = start([a.ackproxy, "--config", os.path.join(ROOT, "config/frameworks/rq.toml"),
                       "--listen", f"127.0.0.1:{proxy_port}",
                       "--upstream", f"127.0.0.1:{redis_port}"])
        wait_ping(proxy_port, proxy, "ackproxy")
        print(f"rq, {a.jobs} no-op jobs, {a.workers} `rq worker --burst`, "
              f"{a.rounds} round(s), direct and through ackproxy interleaved")
        runs = {"direct": [], "ackproxy": []}
        failed = False
        for r in range(1, a.rounds + 1):
            for mode, port in (("direct", redis_port), ("ackproxy", proxy_port)):
                m = one_round(port, redis_port, proxy, a.jobs, a.workers)
                runs[mode].append(m)
                bad = m["done"] != a.jobs or m["leased"] not in (None, 0)
                failed |= bad
                print(f"round {r} {mode:9} {m['jobs_s']:7.0f} jobs/s, CPU µs/job: "
                      f"redis {m['redis_us']:6.1f}, proxy {m['proxy_us']:6.1f}, "
                      f"workers {m['workers_us']:7.1f}; done {m['done']}"
                      + ("" if m["leased"] is None else f", leased {m['leased']}")
                      + ("  FAILED" if bad else ""))
        med = {mode: {k: statistics.median(x[k] for x in v) for k in
                      ("jobs_s", "redis_us", "proxy_us", "workers_us")}
               for mode, v in runs.items()}
        print("\n| rq, one queue | jobs/s | Redis µs/job | proxy µs/job | workers µs/job |")
        print("|---|---:|---:|---:|---:|")
        for mode in ("direct", "ackproxy"):
            m = med[mode]
            print(f"| {mode} | {m['jobs_s']:.0f} | {m['redis_us']:.1f} | "
                  f"{m['proxy_us']:.1f} | {m['workers_us']:.1f} |")
        d, p = med["direct"], med["ackproxy"]
        print(f"\nthrough/direct: jobs/s {p['jobs_s'] / d['jobs_s']:.2f}x, "
              f"Redis µs/job {p['redis_us'] / d['redis_us']:.2f}x, "
              f"workers µs/job {p['workers_us'] / d['workers_us']:.2f}x")
        return 1 if failed else 0
    finally:
        stop_all()
        subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    sys.exit(main())
