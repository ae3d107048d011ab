"""killtest.py adapter for rq: one queue, rq's default ("default"), one
`rq worker` with its default worker class and settings."""

import os

import jobkit

NAME = ["default"]

ready, enqueue, worker = jobkit.python_adapter(
    "rq_jobs", ["rq", "redis"],
    lambda url: [os.path.join(jobkit.VENV, "bin", "rq"), "worker", "--url", url, "default"])
