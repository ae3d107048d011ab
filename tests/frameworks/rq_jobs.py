"""rq's side of killtest.py: the job function the worker imports, and
`python rq_jobs.py enqueue URL N SEED WORKDIR`, which enqueues with rq's own
client API."""

import sys

import jobkit


def job(i, duration_ms, workdir):
    jobkit.run_job(i, duration_ms, workdir)


def enqueue(url, n, seed, workdir):
    from redis import Redis
    from rq import Queue

    queue = Queue("default", connection=Redis.from_url(url))
    for i in range(n):
        queue.enqueue(job, i, jobkit.duration_ms(i, seed), workdir)


if __name__ == "__main__":
    if len(sys.argv) != 6 or sys.argv[1] != "enqueue":
        sys.exit("usage: rq_jobs.py enqueue URL N SEED WORKDIR")
    # Through the imported module, so that the jobs name rq_jobs.job, which
    # the worker can import, and not __main__.job.
    import rq_jobs

    rq_jobs.enqueue(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
