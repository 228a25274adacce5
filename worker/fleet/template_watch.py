"""The warm-start template's first import: while the template imports torch and the rest (seconds,
up to tens of seconds on a loaded machine), it watches its worker as job processes do
(worker/fleet/liveness.py) and exits the moment the worker is gone. worker/fleet/template.py stops the watch
once its imports are done, before the first fork (a process that forks must have one thread).
"""

from __future__ import annotations

from worker.fleet.liveness import watch_worker

# The worker named itself in GLUEJOBS_WORKER_PID before it started this process (worker/fleet/warm.py).
WATCH = watch_worker(parent_death_signal=False)
