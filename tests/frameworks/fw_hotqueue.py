"""killtest.py adapter for hotqueue 0.2.8: queue "jobs" (Redis list
hotqueue:jobs), one worker process running HotQueue.consume()."""

import jobkit

NAME = ["default"]

ready, enqueue, worker = jobkit.python_adapter(
    "hotqueue_jobs", ["hotqueue", "redis"], lambda url: [jobkit.VENV_PY, "-m", "hotqueue_jobs", "worker", url])
