"""Warm start: single-process jobs are forked from a template process that has torch, transformers
and the training code imported, so a job's child starts in milliseconds instead of seconds.

Design. Python's multiprocessing "forkserver" is the mechanism made for this: a small server
process, started from the worker before it has any thread, imports the preload modules
(worker/fleet/template.py: torch, transformers, accelerate, datasets, worker.training.loop …) once and then
forks one child per request from its single thread. We use it rather than a fork server of our own
because it already does what ours would have to: it is single-threaded when it forks, it reaps its
children and reports each exit status (a SIGKILL reads as -9), it exits when the worker goes, and
`ensure_running` starts a fresh one if the template itself has died. Forking the worker itself
would not do: the worker has a supervisor thread per running job, and forking a threaded process
copies locks that no thread will ever release.

The template must stay fit to fork, which worker/fleet/template.py guarantees: it never initialises CUDA
(CUDA_VISIBLE_DEVICES is read when CUDA initialises, so each child still gets its own GPUs) and it
keeps native libraries from starting helper threads at import (OpenBLAS's thread servers,
pyarrow's jemalloc background thread), so the process that forks has exactly one thread.

Isolation is as with a fresh interpreter: each child starts its own session (process group) first
thing, so a cancel still reaches the whole job with killpg; a crash or an out-of-memory kill ends
only that child, and the template goes on forking the next. Should the template itself die, the
next job's start finds it dead and starts a fresh one; the jobs it had forked can no longer report
their exit status, so they are stopped (SIGKILL) and end as killed. The child's stdout and stderr are its
attempt log, and its environment is replaced by exactly what a fresh child would get (the worker's
environment, settings, the job's variables and CUDA_VISIBLE_DEVICES) before any job code runs.

What a fork cannot change is what the interpreter or a library read when the template started, so
a job whose own variables include such a one (PYTHONHASHSEED, asked for by
use_deterministic_algorithms) takes the fresh-interpreter path, as do multi-process jobs (`accelerate
launch`). GLUEJOBS_WARM_START=false turns the warm start off.

What else a start costs, profiled in a forked child: bench/results/warm-start-profile.md.

Torch-free: the worker's parent imports this module; only the template imports torch.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shared.core.tables import Job
from worker.fleet.launch import job_processes
from worker.fleet.liveness import WORKER_PID_ENV
from worker.training.determinism import job_environment

logger = logging.getLogger(__name__)

TEMPLATE_MODULE = "worker.fleet.template"
# Variables a job may set that nothing reads before the job's own code runs: safe after a fork.
# (cuBLAS reads CUBLAS_WORKSPACE_CONFIG when CUDA creates its first handle, in the child.)
READ_LATE = frozenset({"CUBLAS_WORKSPACE_CONFIG"})
# What the forkserver reports when it could not learn a child's status (it died first).
UNKNOWN_STATUS = 255
LAUNCH_TRIES = 3
LAUNCH_RETRY_S = 0.5

# multiprocessing keeps module-level bookkeeping of its children and reads a child's exit status
# from a pipe that two readers would race on: starts and status reads go through this lock.
_PROCESS_LOCK = threading.Lock()


class WarmStarter:
    """The worker's template process and the jobs forked from it."""

    def __init__(self) -> None:
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload([TEMPLATE_MODULE])
        self._ready = threading.Event()
        self._started = False
        self.usable = True  # False once the template has failed to fork at all

    def start(self) -> None:
        """Start the template now; it imports in the background and `wait_ready` tells when it
        forks. The template is a fresh interpreter (fork and exec), whatever threads the worker has.
        It watches this process (worker/fleet/template_watch.py), named in its environment: its parent's
        pid would be another process's if the worker died before the template looked. Once: the
        worker's start-up begins it early, so that its imports overlap the schema check
        (worker/fleet/main.py), and the loop's call finds it begun."""
        if self._started:
            return
        self._started = True
        os.environ[WORKER_PID_ENV] = str(os.getpid())
        multiprocessing.forkserver.ensure_running()
        threading.Thread(target=self._first_fork, name="warm-template", daemon=True).start()

    def wait_ready(self, timeout_s: float) -> bool:
        """Whether the template has forked its first (empty) process, after waiting up to timeout_s.
        A worker claims nothing before: a job it claimed would wait out the template's imports
        (seconds, longer than a lease on a loaded machine) while another worker could run it."""
        return self._ready.wait(timeout_s)

    @property
    def ready(self) -> bool:
        """Whether the template has forked (or failed to: jobs then start fresh interpreters)."""
        return self._ready.is_set()

    def _first_fork(self) -> None:
        started = time.monotonic()
        try:
            process = self._context.Process(target=_nothing, name="gluejobs-template-check")
            with _PROCESS_LOCK:
                process.start()
            process.join()
            logger.info("warm-start template ready in %.1f s", time.monotonic() - started)
        except Exception as exc:  # a template that cannot fork: every job gets a fresh interpreter
            self.usable = False
            logger.warning("the warm-start template failed (%r): jobs start fresh interpreters", exc)
        finally:
            self._ready.set()

    def serves(self, job: Job) -> bool:
        """Whether the job can run in a forked child (see the module docstring)."""
        return self.usable and job_processes(job) == 1 and set(job_environment(job.spec)) <= READ_LATE

    def launch(self, argv: list[str], env: Mapping[str, str], log_path: Path) -> WarmChild:
        for attempt in range(1, LAUNCH_TRIES + 1):
            process = self._context.Process(
                target=run_forked_child, args=(argv, dict(env), str(log_path)), name="gluejobs-job"
            )
            try:
                with _PROCESS_LOCK:
                    process.start()
                return WarmChild(process)
            except (EOFError, OSError) as exc:
                # A template that is dying still takes the request, then hangs up; once it is gone,
                # the next start finds it dead and starts a fresh one.
                if attempt == LAUNCH_TRIES:
                    raise
                logger.warning("the warm-start template did not answer (%r): trying again", exc)
                time.sleep(LAUNCH_RETRY_S)
        raise AssertionError("unreachable")


class WarmChild:
    """A job's child forked from the template (a ChildProcess)."""

    def __init__(self, process: Any) -> None:
        self._process = process
        self._pid: int = process.pid
        self._status: int | None = None

    @property
    def pid(self) -> int:
        return self._pid

    def wait(self, timeout: float | None) -> int | None:
        if self._status is not None:
            return self._status
        if not multiprocessing.connection.wait([self._process.sentinel], timeout):
            return None
        with _PROCESS_LOCK:
            status = self._process.exitcode
            if status is None:
                return None
            self._process.close()
        if status == UNKNOWN_STATUS and self.signal_group(signal.SIGKILL):
            # The template died before its child: the child may still run, and must not outlive
            # the outcome the worker is about to record.
            status = -signal.SIGKILL
        self._status = status
        return status

    def signal_group(self, sig: signal.Signals) -> bool:
        try:
            os.killpg(self._pid, sig)
        except ProcessLookupError:
            # Not (yet) the leader of its own group: the child itself, if it is still there.
            try:
                os.kill(self._pid, sig)
            except ProcessLookupError:
                return False
        return True


def _nothing() -> None:
    """The template's first fork: it answers once the template has imported everything."""


def _leave_the_template() -> None:
    """Drop what the fork copied from the template and a job process must not keep: the write end
    of the template's "alive" pipe (while any process holds it, the template takes its worker to be
    alive: only the worker may), and the template's exit hook (worker/fleet/template.py)."""
    # multiprocessing's own attribute (Python 3.11-3.13 alike), read and cleared by name.
    server = multiprocessing.forkserver._forkserver
    alive_fd = getattr(server, "_forkserver_alive_fd", None)
    if alive_fd is not None:
        os.close(alive_fd)
        setattr(server, "_forkserver_alive_fd", None)  # noqa: B010
    template = sys.modules.get(TEMPLATE_MODULE)
    if template is not None:
        atexit.unregister(template._exit_at_once)


def take_the_thread_count(env: Mapping[str, str]) -> None:
    """The job's OMP_NUM_THREADS (its share of a CPU worker's cores: worker/devices.cpu_threads) for
    the torch the template imported before the fork, which a fresh interpreter reads from the
    environment at start and a forked one never reads again."""
    threads = env.get("OMP_NUM_THREADS", "")
    torch = sys.modules.get("torch")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def run_forked_child(argv: list[str], env: dict[str, str], log_path: str) -> None:
    """The job's child, in the process the template forked: become a fresh job process, then run
    `python -m worker.fleet.child` in-process."""
    os.setsid()  # its own process group, as start_new_session gives a fresh interpreter
    _leave_the_template()
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # lines reach the log as written
    os.environ.clear()
    os.environ.update(env)
    take_the_thread_count(env)
    template = sys.modules.get(TEMPLATE_MODULE)
    sys.stdout.write(
        f"warm start: job process {os.getpid()} forked from template {os.getppid()} "
        f"({getattr(template, 'describe', lambda: 'template not loaded: cold imports')()}; "
        f"CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '<unset>')!r})\n"
    )
    from worker.fleet.child import main

    sys.exit(main(argv))
