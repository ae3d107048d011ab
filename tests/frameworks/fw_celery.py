"""killtest.py adapter for Celery on Redis: broker and Redis result backend
both at the URL. Variants:
  early  Celery's defaults: ack before the task runs, default concurrency
         (one prefork child per CPU), default prefetch multiplier (4).
  late4  task_acks_late=True, --concurrency 4, worker_prefetch_multiplier=4.
  late4-nobackend  late4 without a result backend (nothing written when a
         task ends but kombu's own ack).
"""

import os

import jobkit

NAME = ["early", "late4", "late4-nobackend"]


def ready(variant):
    jobkit.venv_ready("celery", "kombu.transport.redis", "redis")


def _env(variant, url):
    env = jobkit.python_env()
    env["KILLTEST_URL"] = url
    env["KILLTEST_VARIANT"] = variant
    return env


def enqueue(variant, url, n, seed, workdir):
    jobkit.run_enqueue([jobkit.VENV_PY, "-m", "celery_tasks", "enqueue", str(n), str(seed), workdir],
                       _env(variant, url))


def worker(variant, url, workdir, seed):
    # No gossip, mingle or heartbeat: they only exchange broadcast messages
    # with other workers (quieter logs, fewer keys); acknowledgement does not
    # depend on them.
    argv = [os.path.join(jobkit.VENV, "bin", "celery"), "-A", "celery_tasks", "worker",
            "--loglevel=INFO", "--without-gossip", "--without-mingle", "--without-heartbeat"]
    if variant.startswith("late4"):
        argv += ["--concurrency", "4"]
    return argv, _env(variant, url), jobkit.HERE
