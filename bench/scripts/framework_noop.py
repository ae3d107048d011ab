"""The job bench/scripts/framework_jobs.py enqueues: nothing, so that a run
measures what the framework, Redis and the proxy spend per job."""


def noop():
    return None
