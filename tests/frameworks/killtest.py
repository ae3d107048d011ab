#!/usr/bin/env python3
"""Kill test: does a job framework lose jobs when its worker's whole process
tree is SIGKILLed in the middle of a job?

    python3 tests/frameworks/killtest.py FRAMEWORK --url redis://127.0.0.1:PORT/0
        [--jobs 200] [--kills 8] [--seed 1] [--settle-s 60] [--workdir DIR]

Standard library only: this runs with the system python3; the frameworks
run in processes of their own (tests/frameworks/venv, node, ruby).

Every job i (0..N-1) appends "<i>\\n" to WORKDIR/start.log when it begins,
sleeps jobkit.duration_ms(i, seed) (100..300 ms; the formula is in jobkit.py),
then appends "<i>\\n" to WORKDIR/done.log. Each line is written with one
write(2) on a file opened O_APPEND, then fsync(2)ed, before the job goes on.
A job is lost when its number never appears in done.log.

The harness enqueues all N jobs, starts one worker process tree, and kills
it --kills times: each time it waits 0.3..2.0 s, then up to 10 s until a
job of the current worker has started and not finished, then SIGKILLs the
worker's process group and every process descending from it (found through
the ppid links of /proc/*/stat, since some frameworks' job processes call
setsid), and starts the worker again at once. After the last kill it waits
until all N jobs are done, or nothing new was done for --settle-s seconds,
kills the worker and prints one JSON line on stdout:

    {"framework", "url", "jobs", "done": distinct jobs done, "lost": jobs - done,
     "duplicates": done lines - distinct jobs done, "max_runs": most done lines
     of one job, "kills", "kills_mid_job": kills after which a job of the
     killed worker had started and never finished, "seconds"}

Exit status: 0 when the measurement completed (the numbers are the caller's
to judge); 3 when the framework is not installed (adapter's ready() raised);
1 when the harness failed otherwise (enqueue failed, the worker never
started a job); 2 for a bad command line. Diagnostics go to stderr; the
workers' output goes to WORKDIR/worker-K.log (K counts the starts).

Adapters. FRAMEWORK is MODULE or MODULE:VARIANT; MODULE names the file
fw_MODULE.py beside this one, imported with importlib. It provides:

    NAME: list of str
        The variants it serves; the first is used when FRAMEWORK names none.
    ready(variant) -> None
        Raises RuntimeError("what to install") when the framework is missing.
    enqueue(variant, url, n, seed, workdir) -> None
        Enqueues jobs 0..n-1 with the framework's own client API (typically
        in a subprocess: venv python, node, ruby); each job carries i,
        jobkit.duration_ms(i, seed) and workdir. Raises on any failure.
        Must not write to stdout (the harness points it at stderr anyway).
    worker(variant, url, workdir, seed) -> (argv, env, cwd)
        The command that starts ONE worker process tree: argv list, dict of
        environment variables added to the harness's own, working directory.
        The harness starts it in a new session (its own process group),
        stdin from /dev/null, stdout and stderr to WORKDIR/worker-K.log.

Adapters import jobkit (this directory is on sys.path): duration_ms, mark,
run_job, VENV_PY, venv_ready, python_env, run_enqueue.
"""

import argparse
import ctypes
import importlib.util
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# No __pycache__ in the source tree from the adapters imported here.
sys.dont_write_bytecode = True
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import jobkit  # noqa: E402

EXIT_FAILED = 1
EXIT_NOT_INSTALLED = 3

FIRST_JOB_WAIT_S = 60.0
MID_JOB_WAIT_S = 10.0
DEATH_WAIT_S = 10.0
POLL_S = 0.01


def log(msg):
    sys.stderr.write("killtest: %s\n" % msg)
    sys.stderr.flush()


class HarnessError(Exception):
    def __init__(self, msg, code=EXIT_FAILED):
        super().__init__(msg)
        self.code = code


# ---------------------------------------------------------------- processes

def proc_table():
    """pid -> (ppid, pgrp, state) for every process visible in /proc."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                data = f.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the fields that
        # follow start after its last ')'.
        fields = data[data.rfind(b")") + 2:].split()
        try:
            table[int(name)] = (int(fields[1]), int(fields[2]), fields[0].decode())
        except (IndexError, ValueError):
            continue
    return table


def tree(roots, table):
    """The process groups led by `roots` and every descendant of any of
    their members."""
    me = os.getpid()
    roots = set(roots)
    found = {p for p, (_, pgrp, _) in table.items() if p in roots or pgrp in roots}
    children = {}
    for p, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(p)
    stack = list(found)
    while stack:
        for c in children.get(stack.pop(), ()):
            if c not in found:
                found.add(c)
                stack.append(c)
    found.discard(me)
    return found


def signal_pids(pids, sig):
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def reap():
    """Collects every exited child (orphans of killed trees are ours: the
    harness is a child subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_tree(roots):
    """SIGKILLs the trees of `roots` and waits until they are gone.

    The pids are collected before anything is killed: a killed parent's
    children would otherwise be reparented and drop out of the ppid walk.
    Everything found is stopped first (SIGSTOP) and the walk repeated, so
    that a process forked while the walk runs is caught too; then all of
    them get SIGKILL."""
    roots = {r for r in roots if r}
    if not roots:
        return set()
    for r in roots:
        try:
            os.killpg(r, signal.SIGSTOP)
        except (ProcessLookupError, PermissionError):
            pass
    frozen = set()
    for _ in range(20):
        new = tree(roots | frozen, proc_table()) - frozen
        if not new:
            break
        signal_pids(new, signal.SIGSTOP)
        frozen |= new
    signal_pids(frozen, signal.SIGKILL)
    for r in roots:
        try:
            os.killpg(r, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + DEATH_WAIT_S
    while True:
        reap()
        table = proc_table()
        alive = [p for p in frozen if p in table and table[p][2] != "Z"]
        if not alive:
            break
        if time.monotonic() > deadline:
            log("processes still alive after SIGKILL: %s" % alive)
            break
        time.sleep(POLL_S)
    reap()
    return frozen


def set_child_subreaper():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_CHILD_SUBREAPER = 36
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            log("prctl(PR_SET_CHILD_SUBREAPER) failed: errno %d" % ctypes.get_errno())
    except (OSError, AttributeError) as e:
        log("prctl(PR_SET_CHILD_SUBREAPER) unavailable: %s" % e)


# ---------------------------------------------------------------- job logs

class Tail:
    """Reads the complete lines appended to a file since the last call."""

    def __init__(self, path):
        self.path = path
        self.offset = 0
        self.partial = b""

    def new_numbers(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        data = self.partial + data
        cut = data.rfind(b"\n") + 1
        self.partial = data[cut:]
        out = []
        for line in data[:cut].split(b"\n"):
            line = line.strip()
            if line:
                try:
                    out.append(int(line))
                except ValueError:
                    log("ignoring line %r in %s" % (line, self.path))
        return out


class Jobs:
    def __init__(self, workdir, n):
        self.n = n
        self.starts = Tail(os.path.join(workdir, jobkit.START_LOG))
        self.dones = Tail(os.path.join(workdir, jobkit.DONE_LOG))
        self.started_ever = set()
        self.done_runs = {}          # job -> done lines, whole run
        self.done_lines = 0
        self.last_done_at = time.monotonic()
        self.new_generation()

    def new_generation(self):
        """From here on, starts and dones count for the worker started next."""
        self.gen_starts = {}
        self.gen_dones = {}

    def poll(self):
        for i in self.starts.new_numbers():
            self.started_ever.add(i)
            self.gen_starts[i] = self.gen_starts.get(i, 0) + 1
        for i in self.dones.new_numbers():
            if not 0 <= i < self.n:
                log("job number %d out of range" % i)
                continue
            if i not in self.done_runs:
                self.last_done_at = time.monotonic()
            self.done_runs[i] = self.done_runs.get(i, 0) + 1
            self.done_lines += 1
            self.gen_dones[i] = self.gen_dones.get(i, 0) + 1

    def in_flight(self):
        """Jobs the current worker started and has not finished."""
        return [i for i, s in self.gen_starts.items() if s > self.gen_dones.get(i, 0)]

    def all_done(self):
        return len(self.done_runs) >= self.n


# ---------------------------------------------------------------- the run

def load_adapter(framework):
    m = re.fullmatch(r"([a-z0-9_]+)(?::([A-Za-z0-9_.-]+))?", framework)
    if not m:
        raise HarnessError("bad FRAMEWORK %r: MODULE or MODULE:VARIANT" % framework, 2)
    module, variant = m.group(1), m.group(2)
    path = os.path.join(HERE, "fw_%s.py" % module)
    if not os.path.isfile(path):
        raise HarnessError("no adapter %s" % path, 2)
    spec = importlib.util.spec_from_file_location("fw_%s" % module, path)
    adapter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(adapter)
    variants = list(adapter.NAME)
    if variant is None:
        variant = variants[0]
    elif variant not in variants:
        raise HarnessError("%s has no variant %r (it has %s)" % (module, variant, ", ".join(variants)), 2)
    return adapter, variant


class Workers:
    def __init__(self, adapter, variant, url, workdir, seed):
        self.argv, env_add, self.cwd = adapter.worker(variant, url, workdir, seed)
        self.env = dict(os.environ)
        self.env.update(env_add)
        self.workdir = workdir
        self.starts = 0
        self.pid = None
        self.proc = None

    def start(self):
        logpath = os.path.join(self.workdir, "worker-%d.log" % self.starts)
        self.starts += 1
        with open(logpath, "ab") as out:
            self.proc = subprocess.Popen(self.argv, cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.pid = self.proc.pid
        self.logpath = logpath

    def exited(self):
        """True when the worker's first process is gone (died by itself)."""
        try:
            pid, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return True
        return pid != 0

    def kill(self):
        if self.pid is not None:
            kill_tree([self.pid])
            self.pid = None
            self.proc = None

    def log_tail(self, lines=30):
        try:
            with open(self.logpath, "rb") as f:
                return b"".join(f.readlines()[-lines:]).decode(errors="replace")
        except (OSError, AttributeError):
            return ""


def wait_until(jobs, workers, cond, timeout):
    """Polls the job logs until cond() or the timeout; restarts a worker that
    died by itself. Returns cond()'s last value."""
    deadline = time.monotonic() + timeout
    while True:
        jobs.poll()
        if cond():
            return True
        if time.monotonic() >= deadline:
            return False
        if workers.pid is not None and workers.exited():
            log("worker exited by itself; last lines of %s:\n%s" % (workers.logpath, workers.log_tail()))
            workers.kill()
            time.sleep(1.0)
            jobs.poll()
            jobs.new_generation()
            workers.start()
        time.sleep(POLL_S)


def run(args, t0):
    adapter, variant = load_adapter(args.framework)
    try:
        adapter.ready(variant)
    except RuntimeError as e:
        raise HarnessError("%s is not installed: %s" % (args.framework, e), EXIT_NOT_INSTALLED)

    workdir = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="killtest-"))
    os.makedirs(workdir, exist_ok=True)
    for name in os.listdir(workdir):
        if name in (jobkit.START_LOG, jobkit.DONE_LOG) or re.fullmatch(r"worker-\d+\.log", name):
            os.unlink(os.path.join(workdir, name))
    log("%s: workdir %s" % (args.framework, workdir))

    try:
        adapter.enqueue(variant, args.url, args.jobs, args.seed, workdir)
    except Exception as e:  # noqa: BLE001 - any adapter failure is the harness's
        raise HarnessError("enqueue failed: %s" % e)
    log("enqueued %d jobs in %.1f s" % (args.jobs, time.monotonic() - t0))

    rng = random.Random(args.seed)
    jobs = Jobs(workdir, args.jobs)
    workers = Workers(adapter, variant, args.url, workdir, args.seed)
    kills = kills_mid_job = 0
    try:
        workers.start()
        if not wait_until(jobs, workers, lambda: jobs.started_ever, FIRST_JOB_WAIT_S):
            raise HarnessError("the worker started no job within %.0f s; last lines of %s:\n%s"
                               % (FIRST_JOB_WAIT_S, workers.logpath, workers.log_tail()))

        for k in range(args.kills):
            wait_until(jobs, workers, lambda: False, rng.uniform(0.3, 2.0))
            wait_until(jobs, workers, lambda: jobs.in_flight(), MID_JOB_WAIT_S)
            workers.kill()
            kills += 1
            # The tree is dead: whatever it wrote is in the files now.
            jobs.poll()
            lost_here = sorted(jobs.in_flight())
            if lost_here:
                kills_mid_job += 1
            log("kill %d/%d: in flight %s; done %d/%d"
                % (k + 1, args.kills, lost_here or "none", len(jobs.done_runs), args.jobs))
            jobs.new_generation()
            workers.start()

        jobs.last_done_at = time.monotonic()
        settle_deadline = time.monotonic() + args.jobs * 1.0 + 300.0
        while not jobs.all_done():
            remaining = min(settle_deadline, jobs.last_done_at + args.settle_s) - time.monotonic()
            if remaining <= 0:
                break
            wait_until(jobs, workers, jobs.all_done, min(remaining, 1.0))
        workers.kill()
        jobs.poll()
    finally:
        workers.kill()

    if not jobs.started_ever:
        raise HarnessError("no job ever started")
    done = len(jobs.done_runs)
    return {
        "framework": args.framework,
        "url": args.url,
        "jobs": args.jobs,
        "done": done,
        "lost": args.jobs - done,
        "duplicates": jobs.done_lines - done,
        "max_runs": max(jobs.done_runs.values(), default=0),
        "kills": kills,
        "kills_mid_job": kills_mid_job,
        "seconds": round(time.monotonic() - t0, 1),
    }


def kill_descendants():
    """Last resort on the way out: everything below the harness."""
    me = os.getpid()
    table = proc_table()
    children = {}
    for p, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(p)
    below, stack = set(), [me]
    while stack:
        for c in children.get(stack.pop(), ()):
            if c not in below:
                below.add(c)
                stack.append(c)
    if below:
        signal_pids(below, signal.SIGSTOP)
        signal_pids(below, signal.SIGKILL)
        time.sleep(0.05)
        reap()


def main():
    p = argparse.ArgumentParser(description="SIGKILL a job framework's workers mid-job and count lost jobs.")
    p.add_argument("framework", help="MODULE or MODULE:VARIANT, e.g. rq, celery:late4")
    p.add_argument("--url", required=True, help="redis://HOST:PORT/DB the framework talks to")
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--kills", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--settle-s", type=float, default=60.0)
    p.add_argument("--workdir")
    args = p.parse_args()
    if args.jobs < 1 or args.kills < 0 or args.settle_s < 0:
        p.error("--jobs must be >= 1, --kills and --settle-s >= 0")

    # stdout carries the result line only: whatever the adapters or their
    # subprocesses print lands on stderr.
    result_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def on_signal(signum, frame):
        raise SystemExit(128 + signum)

    def on_interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    # Also when started with SIGINT ignored (a background job of a script).
    signal.signal(signal.SIGINT, on_interrupt)
    set_child_subreaper()

    t0 = time.monotonic()
    code = 0
    try:
        result = run(args, t0)
        result_out.write(json.dumps(result) + "\n")
        result_out.flush()
    except HarnessError as e:
        log(str(e))
        code = e.code
    except KeyboardInterrupt:
        log("interrupted")
        code = 130
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else EXIT_FAILED
    except Exception:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        code = EXIT_FAILED
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        kill_descendants()
    sys.exit(code)


if __name__ == "__main__":
    main()
