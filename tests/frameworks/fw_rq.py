"""killtest.py adapter for rq: one queue, rq's default ("default"), one
`rq worker` with its default worker class and settings."""

import os

import jobkit

NAME = ["default"]


def ready(variant):
    jobkit.venv_ready("rq", "redis")


def enqueue(variant, url, n, seed, workdir):
    jobkit.run_enqueue([jobkit.VENV_PY, "-m", "rq_jobs", "enqueue", url, str(n), str(seed), workdir],
                       jobkit.python_env())


def worker(variant, url, workdir, seed):
    argv = [os.path.join(jobkit.VENV, "bin", "rq"), "worker", "--url", url, "default"]
    return argv, jobkit.python_env(), jobkit.HERE
