"""killtest.py adapter for Bull 3 (node/bull.js): queue "jobs", prefix
"bull", one node worker with queue.process(2, handler) and Bull's default
settings (30 s job locks renewed every 15 s, stalled-job check every 30 s,
maxStalledCount 1). Stalled jobs come back only after their lock has
expired and a check has run: give killtest.py --settle-s 75 or so."""

import nodekit

NAME = ["default"]

ready, enqueue, worker = nodekit.adapter("bull.js", "bull")
