"""Celery's side of killtest.py: the app and its task, configured from the
environment (KILLTEST_URL: broker and result backend, the same Redis
database; KILLTEST_VARIANT: early, late4 or late4-nobackend), and
`python celery_tasks.py enqueue N SEED WORKDIR`, which sends the tasks with
Celery's own client API."""

import os
import sys

from celery import Celery

import jobkit

URL = os.environ["KILLTEST_URL"]
VARIANT = os.environ.get("KILLTEST_VARIANT", "early")

app = Celery("celery_tasks", broker=URL,
             backend=None if VARIANT == "late4-nobackend" else URL)
# Only silences the deprecation warning about the 6.0 default; it changes
# nothing once the broker is up.
app.conf.broker_connection_retry_on_startup = True
if VARIANT in ("late4", "late4-nobackend"):
    app.conf.task_acks_late = True
    app.conf.worker_prefetch_multiplier = 4
elif VARIANT != "early":
    raise SystemExit("unknown KILLTEST_VARIANT %r" % VARIANT)


@app.task
def job(i, duration_ms, workdir):
    jobkit.run_job(i, duration_ms, workdir)


def enqueue(n, seed, workdir):
    for i in range(n):
        job.delay(i, jobkit.duration_ms(i, seed), workdir)


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "enqueue":
        sys.exit("usage: KILLTEST_URL=... celery_tasks.py enqueue N SEED WORKDIR")
    # Through the imported module, so that the task is registered under
    # celery_tasks.job, the name the worker knows.
    import celery_tasks

    celery_tasks.enqueue(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
