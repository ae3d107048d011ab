"""What every job of killtest.py does, shared by the harness (system
python3) and the Python job modules (run by the venv's python): standard
library only.
"""

import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
VENV = os.path.join(HERE, "venv")
VENV_PY = os.path.join(VENV, "bin", "python")

START_LOG = "start.log"
DONE_LOG = "done.log"


def duration_ms(i, seed):
    """How long job i sleeps, 100..300 ms. Integer arithmetic only, so that
    adapters in other languages compute the same number:
    100 + (((i + 1) * 2654435761 + seed * 40503) mod 2^32) mod 201."""
    return 100 + (((i + 1) * 2654435761 + seed * 40503) % 4294967296) % 201


def mark(workdir, name, i):
    """Appends "<i>\\n" to workdir/name and waits until it is on disk: the
    line has to survive the SIGKILL that may follow right after."""
    fd = os.open(os.path.join(workdir, name), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"%d\n" % i)
        os.fsync(fd)
    finally:
        os.close(fd)


def run_job(i, duration, workdir):
    mark(workdir, START_LOG, int(i))
    time.sleep(int(duration) / 1000.0)
    mark(workdir, DONE_LOG, int(i))


def venv_ready(*imports):
    """Raises RuntimeError naming what to install unless the venv's python
    imports every module of `imports`."""
    hint = "run tests/frameworks/setup.sh (pip install -r tests/frameworks/requirements.txt into tests/frameworks/venv)"
    if not os.access(VENV_PY, os.X_OK):
        raise RuntimeError("no venv at %s: %s" % (VENV, hint))
    code = "import " + ", ".join(imports)
    r = subprocess.run([VENV_PY, "-c", code], stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    if r.returncode != 0:
        raise RuntimeError("%s failed in the venv: %s\n%s" % (code, hint, r.stdout.decode(errors="replace")))


def python_env():
    """Environment additions for the venv's python running the job modules
    of this directory."""
    path = os.environ.get("PYTHONPATH")
    return {
        "PYTHONPATH": HERE + (os.pathsep + path if path else ""),
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def run_enqueue(argv, env_add, timeout=300):
    """Runs an enqueue command; raises RuntimeError with its output unless it
    exits 0. Its output goes to stderr otherwise: stdout carries only the
    harness's result line."""
    env = dict(os.environ)
    env.update(env_add)
    r = subprocess.run(argv, cwd=HERE, env=env, stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    out = r.stdout.decode(errors="replace")
    if r.returncode != 0:
        raise RuntimeError("enqueue failed (exit %d): %s\n%s" % (r.returncode, " ".join(argv), out))
    if out.strip():
        sys.stderr.write(out if out.endswith("\n") else out + "\n")


def python_adapter(jobs_module, imports, worker_argv):
    """ready, enqueue and worker of an adapter whose jobs are enqueued by
    `python -m jobs_module enqueue URL N SEED WORKDIR` in the venv (whose
    python must import `imports`) and whose worker runs `worker_argv(url)`,
    both with python_env()."""

    def ready(variant):
        venv_ready(*imports)

    def enqueue(variant, url, n, seed, workdir):
        run_enqueue([VENV_PY, "-m", jobs_module, "enqueue", url, str(n), str(seed), workdir], python_env())

    def worker(variant, url, workdir, seed):
        return worker_argv(url), python_env(), HERE

    return ready, enqueue, worker
