"""hotqueue's side of killtest.py:
  python hotqueue_jobs.py enqueue URL N SEED WORKDIR   HotQueue.put
  python hotqueue_jobs.py worker URL                   HotQueue.consume loop
"""

import sys

from hotqueue import HotQueue
from redis.connection import parse_url

import jobkit


def queue(url):
    # HotQueue passes its keyword arguments to redis.Redis; it takes no URL.
    # consume() waits in BLPOP with timeout 0 (forever), as hotqueue was
    # written for redis-py 2, whose sockets had no read timeout; redis-py 8
    # defaults to a 5 s one, and an idle worker would die after its retries
    # (about a minute).
    return HotQueue("jobs", socket_timeout=None, **parse_url(url))


def enqueue(url, n, seed, workdir):
    q = queue(url)
    for i in range(n):
        q.put({"i": i, "duration_ms": jobkit.duration_ms(i, seed), "workdir": workdir})


def work(url):
    for msg in queue(url).consume():
        jobkit.run_job(msg["i"], msg["duration_ms"], msg["workdir"])


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "enqueue":
        enqueue(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    elif len(sys.argv) == 3 and sys.argv[1] == "worker":
        work(sys.argv[2])
    else:
        sys.exit("usage: hotqueue_jobs.py enqueue URL N SEED WORKDIR | worker URL")
