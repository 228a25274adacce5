"""A job's process never outlives its worker: it watches the worker's pid and exits when it dies.

The worker hands its pid down in GLUEJOBS_WORKER_PID. That works whatever sits between the two:
the worker itself, `accelerate launch` (each rank watches), or a template process that forks job
processes. The watch is a pidfd (Linux ≥ 5.3) polled by a daemon thread: it wakes the moment the
worker exits, SIGKILL and the OOM killer included, without a pipe the worker must hold open. Where
the worker is the direct parent, PR_SET_PDEATHSIG asks the kernel for a SIGKILL as well.

The warm-start template (worker/fleet/template_watch.py) uses the same watch while it imports, and stops it
before it forks (`WorkerWatch.stop`): a process that forks must have one thread.

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
STOP_WAIT_S = 1.0
_PR_SET_PDEATHSIG = 1


class WorkerWatch:
    """A running watch: its thread, and `stop()` to end it (the process then lives on its own)."""

    def __init__(self, pid: int, handle: int) -> None:
        self.pid = pid
        self._handle = handle
        self._stop_r, self._stop_w = os.pipe()
        self.thread = threading.Thread(target=self._watch, name="gluejobs-liveness", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """End the watch and wait for its thread to be gone."""
        os.write(self._stop_w, b"x")
        native_id = self.thread.native_id
        self.thread.join()
        # join() returns when the thread's Python code is done; the kernel's thread ends a moment
        # later. A process about to fork (the template) waits for that too, so that it forks alone.
        deadline = time.monotonic() + STOP_WAIT_S
        while os.path.exists(f"/proc/self/task/{native_id}") and time.monotonic() < deadline:
            time.sleep(0.001)
        for fd in (self._stop_r, self._stop_w, self._handle):
            if fd >= 0:
                os.close(fd)

    def _watch(self) -> None:
        poller = select.poll()
        poller.register(self._stop_r, select.POLLIN)
        if self._handle >= 0:
            poller.register(self._handle, select.POLLIN)  # readable once the process has exited
        while True:
            events = poller.poll(None if self._handle >= 0 else POLL_FALLBACK_S * 1000)
            if any(fd == self._stop_r for fd, _ in events):
                return
            if events or not _alive(self.pid):
                _orphaned(self.pid)


def watch_worker(pid: int | None = None, *, parent_death_signal: bool = True) -> WorkerWatch | None:
    """Start watching the worker (GLUEJOBS_WORKER_PID unless `pid` is given); None without one
    (a job process started by hand, or by a test). `parent_death_signal` asks the kernel for a
    SIGKILL too where the worker is the parent; the template declines it, because the kernel sends
    it when the *thread* that started the process ends, and a template restarted from a job's
    supervisor thread would die with that job."""
    if pid is None:
        value = os.environ.get(WORKER_PID_ENV, "")
        if not value.isdigit():
            return None
        pid = int(value)
    if parent_death_signal and os.getppid() == pid:
        _kill_me_with_my_parent()
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        _orphaned(pid)
    except OSError:  # no pidfd here (an old kernel, a sandbox): poll instead
        handle = -1
    # (A worker that died before the pidfd was taken is caught by the open's ProcessLookupError; one
    # whose pid was reused in that instant would not be, a window of the process's first milliseconds.)
    return WorkerWatch(pid, handle)


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
