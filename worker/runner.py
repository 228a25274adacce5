"""The worker: claim a job → run it in a child process → heartbeat → record the outcome.

The loop is control flow only; every database access is a jobs_repo call. Nothing here imports
torch: the parent stays small, and a job's crash, out-of-memory kill or cancel ends only its child.
SIGTERM/SIGINT stop taking work; a running job is stopped and put back in the queue (without
spending an attempt), and the next worker resumes it from its newest checkpoint.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from secrets import token_hex
from types import FrameType

from shared import jobs_repo
from shared.config import Settings
from shared.db import Database
from shared.models import Job, JobStatus
from worker.determinism import job_environment
from worker.liveness import WORKER_PID_ENV
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


class Worker:
    def __init__(
        self, settings: Settings, db: Database | None = None, *, worker_id: str | None = None
    ) -> None:
        self.settings = settings
        self.db = db or Database(settings.database_url)
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{token_hex(3)}"
        self._stopping = threading.Event()

    # --- the loop -----------------------------------------------------------------------------------

    def run(self, *, exit_when_idle: bool = False, max_jobs: int | None = None) -> list[JobOutcome]:
        """Work until stopped (or, with exit_when_idle, until the queue is empty)."""
        with self.db.session() as session:
            jobs_repo.register_worker(
                session, worker_id=self.worker_id, host=socket.gethostname(), pid=os.getpid()
            )
        logger.info("worker %s started", self.worker_id)
        outcomes: list[JobOutcome] = []
        try:
            while not self._stopping.is_set() and (max_jobs is None or len(outcomes) < max_jobs):
                self._recover_expired_leases()
                job = self._claim()
                if job is None:
                    if exit_when_idle:
                        break
                    self._stopping.wait(self.settings.poll_interval_s)
                    continue
                outcomes.append(self.run_job(job))
        finally:
            with self.db.session() as session:
                jobs_repo.worker_stopped(session, worker_id=self.worker_id)
            logger.info("worker %s stopped after %d job(s)", self.worker_id, len(outcomes))
        return outcomes

    def stop(self) -> None:
        """Stop taking work; a running job is handed back to the queue."""
        self._stopping.set()

    def install_signal_handlers(self) -> None:
        def handle(signum: int, _frame: FrameType | None) -> None:
            logger.info("received %s: stopping", signal.Signals(signum).name)
            self.stop()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    def _claim(self) -> Job | None:
        with self.db.session() as session:
            return jobs_repo.claim_next(session, worker_id=self.worker_id, lease_s=self.settings.lease_s)

    def _recover_expired_leases(self) -> None:
        with self.db.session() as session:
            for expired in jobs_repo.recover_expired_leases(session):
                logger.warning(
                    "job %s: its worker stopped heartbeating; %s",
                    expired.job_id,
                    "requeued" if expired.requeued else "no attempts left",
                )

    # --- one job --------------------------------------------------------------------------------

    def run_job(self, job: Job) -> JobOutcome:
        output_dir = (self.settings.artifacts_dir / "jobs" / str(job.id)).resolve()
        outcome = JobOutcome(job.id, JobStatus.failed, "the worker failed before the job started")
        try:
            log_dir(output_dir).mkdir(parents=True, exist_ok=True)
            clear_errors(output_dir)
            with self.db.session() as session:
                jobs_repo.set_output_dir(
                    session, job_id=job.id, worker_id=self.worker_id, output_dir=str(output_dir)
                )
            log_path = log_dir(output_dir) / f"attempt-{job.attempts}.log"
            logger.info("job %s: attempt %d, log %s", job.id, job.attempts, log_path)
            returncode, stopped = self._run_child(job, log_path)
            outcome = self._outcome(job, output_dir, log_path, returncode, stopped)
        except Exception as exc:  # the worker survives any one job's failure
            logger.exception("job %s: the worker could not run it", job.id)
            outcome = JobOutcome(job.id, JobStatus.failed, f"the worker could not run the job: {exc}")
        finally:
            self._record(outcome)
        return outcome

    def _run_child(self, job: Job, log_path: Path) -> tuple[int, Stop | None]:
        with log_path.open("ab") as log:
            child = subprocess.Popen(
                child_command(job, worker_id=self.worker_id),
                stdout=log,
                stderr=subprocess.STDOUT,
                env={
                    **child_environment(self.settings),
                    **job_environment(job.spec),
                    WORKER_PID_ENV: str(os.getpid()),
                },
                start_new_session=True,  # its own process group: a stop reaches all of `accelerate launch`
            )
            stopped = self._supervise(job, child)
            return child.wait(), stopped

    def _supervise(self, job: Job, child: subprocess.Popen[bytes]) -> Stop | None:
        """Heartbeat while the child runs; stop it on cancel, on a lost lease, or on shutdown."""
        while True:
            try:
                child.wait(timeout=self.settings.heartbeat_s)
                return None
            except subprocess.TimeoutExpired:
                pass
            stop = Stop.shutdown if self._stopping.is_set() else self._heartbeat(job)
            if stop is not None:
                logger.info("job %s: stopping its process (%s)", job.id, stop)
                terminate(child, grace_s=self.settings.cancel_grace_s)
                return stop

    def _heartbeat(self, job: Job) -> Stop | None:
        try:
            with self.db.session() as session:
                status = jobs_repo.heartbeat(
                    session, job_id=job.id, worker_id=self.worker_id, lease_s=self.settings.lease_s
                )
        except Exception:  # a database blip: keep the job running and try again next beat
            logger.exception("job %s: heartbeat failed", job.id)
            return None
        if status is None:
            return Stop.lease_lost
        return Stop.cancelled if status == JobStatus.cancelling else None

    def _outcome(
        self, job: Job, output_dir: Path, log_path: Path, returncode: int, stopped: Stop | None
    ) -> JobOutcome:
        if stopped == Stop.cancelled:
            return JobOutcome(job.id, JobStatus.cancelled)
        if stopped in (Stop.shutdown, Stop.lease_lost):
            return JobOutcome(job.id, None, stopped=stopped)
        if returncode == 0:
            return JobOutcome(job.id, JobStatus.succeeded)
        return JobOutcome(job.id, JobStatus.failed, failure_message(output_dir, returncode, log_path))

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


def child_command(job: Job, *, worker_id: str) -> list[str]:
    processes = int(job.spec.get("num_processes") or 1)
    claim = ["--job-id", str(job.id), "--worker-id", worker_id, "--attempt", str(job.attempts)]
    if processes == 1:
        return [sys.executable, "-m", "worker.child", *claim]
    # `--multi_gpu` is accelerate's name for "one process per device through torch.distributed";
    # without a GPU the processes share the CPU over gloo, which is how the tests run it.
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        str(processes),
        "--num_machines",
        "1",
        "--main_process_port",
        str(_free_port()),
        "--dynamo_backend",
        "no",
        "--module",
        "worker.child",
        *claim,
    ]


def _free_port() -> int:
    """A port for the job's rendezvous: two multi-process jobs on one machine must not share one."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_environment(settings: Settings) -> dict[str, str]:
    """The worker's environment plus its settings, so the child sees exactly what the worker sees."""
    env = dict(os.environ)
    for name, value in settings.model_dump().items():
        if isinstance(value, list):
            value = ",".join(value)
        if value is not None:
            env[f"GLUEJOBS_{name.upper()}"] = str(value)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def terminate(child: subprocess.Popen[bytes], *, grace_s: float) -> None:
    """SIGTERM the child's process group, then SIGKILL what is left after the grace period."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        try:
            child.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
