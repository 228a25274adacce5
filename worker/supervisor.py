"""One running job, supervised from a thread of the worker: start its child, heartbeat its lease,
stop it on cancel / lost lease / shutdown, and record the outcome.

A worker runs one JobSupervisor per running job, each on its own thread, so each job's lease is
renewed on its own schedule and a slow job never delays another's heartbeat. Every database access
is a jobs_repo call in its own short transaction.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from shared import jobs_repo
from shared.config import Settings
from shared.db import Database
from shared.models import Job, JobStatus
from worker.launch import ChildProcess, terminate
from worker.outcome import clear_errors, failure_message, log_dir

logger = logging.getLogger(__name__)


class Stop(StrEnum):
    """Why the runner stopped a child before it finished."""

    cancelled = "cancelled"
    lease_lost = "lease_lost"
    shutdown = "shutdown"


@dataclass(frozen=True)
class JobOutcome:
    job_id: int
    status: JobStatus | None  # None when the job was handed back (shutdown) or taken away (lease lost)
    error: str | None = None
    stopped: Stop | None = None


# Starts a job's child: (job, its devices, its attempt log) → the running child.
Launcher = Callable[[Job, list[str], Path], ChildProcess]


class JobSupervisor:
    """Runs one claimed job to its outcome; `start()` runs it on a thread of its own."""

    def __init__(
        self,
        job: Job,
        devices: list[str],
        *,
        settings: Settings,
        db: Database,
        worker_id: str,
        launch: Launcher,
        stopping: threading.Event,
        on_done: Callable[[JobSupervisor], None],
    ) -> None:
        self.job = job
        self.devices = devices
        self.settings = settings
        self.db = db
        self.worker_id = worker_id
        self._launch = launch
        self._stopping = stopping  # the worker's: set on shutdown
        self._on_done = on_done
        self.outcome: JobOutcome | None = None
        self.thread = threading.Thread(target=self.run, name=f"job-{job.id}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def run(self) -> JobOutcome:
        job = self.job
        output_dir = self.settings.job_dir(job.id)
        outcome = JobOutcome(job.id, JobStatus.failed, "the worker failed before the job started")
        try:
            log_path = self._prepare(output_dir)
            logger.info(
                "job %s: attempt %d on %s, log %s", job.id, job.attempts, ",".join(self.devices), log_path
            )
            child = self._launch(job, self.devices, log_path)
            stopped = self._supervise(child)
            returncode = child.wait(None)
            assert returncode is not None
            outcome = self._outcome(output_dir, log_path, returncode, stopped)
        except Exception as exc:  # the worker survives any one job's failure
            logger.exception("job %s: the worker could not run it", job.id)
            outcome = JobOutcome(job.id, JobStatus.failed, f"the worker could not run the job: {exc}")
        finally:
            self._record(outcome)
            self.outcome = outcome
            self._on_done(self)
        return outcome

    def _prepare(self, output_dir: Path) -> Path:
        """The job's folder and its attempt's log; the job row learns both and its devices."""
        log_dir(output_dir).mkdir(parents=True, exist_ok=True)
        clear_errors(output_dir)
        with self.db.session() as session:
            jobs_repo.set_output_dir(
                session,
                job_id=self.job.id,
                worker_id=self.worker_id,
                output_dir=str(output_dir),
                devices=self.devices,
            )
        return log_dir(output_dir) / f"attempt-{self.job.attempts}.log"

    def _supervise(self, child: ChildProcess) -> Stop | None:
        """Heartbeat while the child runs; stop it on cancel, on a lost lease, or on shutdown."""
        while child.wait(self.settings.heartbeat_s) is None:
            stop = Stop.shutdown if self._stopping.is_set() else self._heartbeat()
            if stop is not None:
                logger.info("job %s: stopping its process (%s)", self.job.id, stop)
                terminate(child, grace_s=self.settings.cancel_grace_s)
                return stop
        return None

    def _heartbeat(self) -> Stop | None:
        try:
            with self.db.session() as session:
                status = jobs_repo.heartbeat(
                    session, job_id=self.job.id, worker_id=self.worker_id, lease_s=self.settings.lease_s
                )
        except Exception:  # a database blip: keep the job running and try again next beat
            logger.exception("job %s: heartbeat failed", self.job.id)
            return None
        if status is None:
            return Stop.lease_lost
        return Stop.cancelled if status == JobStatus.cancelling else None

    def _outcome(self, output_dir: Path, log_path: Path, returncode: int, stopped: Stop | None) -> JobOutcome:
        job_id = self.job.id
        if stopped == Stop.cancelled:
            return JobOutcome(job_id, JobStatus.cancelled)
        if stopped in (Stop.shutdown, Stop.lease_lost):
            return JobOutcome(job_id, None, stopped=stopped)
        if returncode == 0:
            return JobOutcome(job_id, JobStatus.succeeded)
        return JobOutcome(job_id, JobStatus.failed, failure_message(output_dir, returncode, log_path))

    def _record(self, outcome: JobOutcome) -> None:
        try:
            with self.db.session() as session:
                if outcome.status is not None:
                    recorded = jobs_repo.finish_job(
                        session,
                        job_id=outcome.job_id,
                        worker_id=self.worker_id,
                        status=outcome.status,
                        error=outcome.error,
                    )
                    if not recorded:
                        logger.warning(
                            "job %s: no longer ours; outcome %s not recorded", outcome.job_id, outcome.status
                        )
                elif outcome.stopped == Stop.shutdown:
                    jobs_repo.release_job(
                        session,
                        job_id=outcome.job_id,
                        worker_id=self.worker_id,
                        reason=f"worker {self.worker_id} shut down",
                    )
        except Exception:
            # The lease will expire and another worker will pick the job up again.
            logger.exception("job %s: could not record its outcome", outcome.job_id)
        logger.info(
            "job %s: %s%s",
            outcome.job_id,
            outcome.status or outcome.stopped,
            f" ({outcome.error.splitlines()[0]})" if outcome.status and outcome.error else "",
        )
