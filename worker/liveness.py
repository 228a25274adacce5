"""A job's process never outlives its worker: it watches the worker's pid and exits when it dies.

The worker hands its pid down in GLUEJOBS_WORKER_PID. That works whatever sits between the two:
the worker itself, `accelerate launch` (each rank watches), or a template process that forks job
processes. The watch is a pidfd (Linux ≥ 5.3) polled by a daemon thread: it wakes the moment the
worker exits, SIGKILL and the OOM killer included, without a pipe the worker must hold open. Where
the worker is the direct parent, PR_SET_PDEATHSIG asks the kernel for a SIGKILL as well.

Why exit rather than finish the step: a worker that is gone stops renewing the job's lease, so
another worker will run the job again; anything this process wrote after that would be a second
writer in the job's folder. Its database writes are fenced anyway (jobs_repo.Claim); exiting at
once keeps its files out of the next attempt's way too.
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import signal
import threading
import time

logger = logging.getLogger(__name__)

WORKER_PID_ENV = "GLUEJOBS_WORKER_PID"
# The exit status of a job process that stopped because its worker died (nobody is left to read it;
# it shows in a log or a shell).
ORPHANED_EXIT = 70
POLL_FALLBACK_S = 1.0
_PR_SET_PDEATHSIG = 1


def watch_worker(pid: int | None = None) -> threading.Thread | None:
    """Start watching the worker (GLUEJOBS_WORKER_PID unless `pid` is given); None without one
    (a job process started by hand, or by a test)."""
    if pid is None:
        value = os.environ.get(WORKER_PID_ENV, "")
        if not value.isdigit():
            return None
        pid = int(value)
    if os.getppid() == pid:
        _kill_me_with_my_parent()
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        _orphaned(pid)
    except OSError:  # no pidfd here (an old kernel, a sandbox): poll instead
        handle = -1
    # (A worker that died before the pidfd was taken is caught by the open's ProcessLookupError; one
    # whose pid was reused in that instant would not be, a window of the process's first milliseconds.)
    thread = threading.Thread(target=_watch, args=(pid, handle), name="gluejobs-liveness", daemon=True)
    thread.start()
    return thread


def _watch(pid: int, handle: int) -> None:
    if handle >= 0:
        poller = select.poll()
        poller.register(handle, select.POLLIN)
        while not poller.poll():  # readable once the process has exited
            pass
        _orphaned(pid)
    while _alive(pid):
        time.sleep(POLL_FALLBACK_S)
    _orphaned(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_me_with_my_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the pid watch alone does it
        pass


def _orphaned(pid: int) -> None:
    logger.error("the worker (pid %d) is gone: this job process stops now", pid)
    logging.shutdown()
    os._exit(ORPHANED_EXIT)
