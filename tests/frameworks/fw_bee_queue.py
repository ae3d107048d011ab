"""killtest.py adapter for bee-queue 2.0.0 (node/bee.js): queue "jobs",
prefix "bq", one node worker with queue.process(2, handler). Variants:
  checker    the worker also runs queue.checkStalledJobs(5000), as
             bee-queue's README recommends (stallInterval is 5000 ms).
  nochecker  it does not: stalled jobs go back to waiting only in the check
             that process() runs once when a worker starts, and only when
             no check ran in the 5 s before (bq:jobs:stallBlock).
"""

import nodekit

NAME = ["checker", "nochecker"]

ready, enqueue, worker = nodekit.adapter("bee.js", "bee-queue", variants=True)
