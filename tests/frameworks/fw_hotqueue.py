"""killtest.py adapter for hotqueue 0.2.8: queue "jobs" (Redis list
hotqueue:jobs), one worker process running HotQueue.consume()."""

import jobkit

NAME = ["default"]


def ready(variant):
    jobkit.venv_ready("hotqueue", "redis")


def enqueue(variant, url, n, seed, workdir):
    jobkit.run_enqueue([jobkit.VENV_PY, "-m", "hotqueue_jobs", "enqueue", url, str(n), str(seed), workdir],
                       jobkit.python_env())


def worker(variant, url, workdir, seed):
    return [jobkit.VENV_PY, "-m", "hotqueue_jobs", "worker", url], jobkit.python_env(), jobkit.HERE
