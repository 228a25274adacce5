"""A worker's part in a job of several machines when it is not rank 0 (issue 37): it joined an open
gang (shared/jobs_repo/gangs.py) and runs its machine's processes of rank 0's attempt.

A member holds no claim of its own: the job's lease, attempt and rows are rank 0's (its supervisor,
worker/fleet/supervisor.py, records the outcome). What a member does:

- it launches `gang_command` with its machine rank and rank 0's rendezvous, carrying rank 0's claim
  (its processes are never the main one: they write no rows, no checkpoint, no model; only rank 0's
  machine publishes and uploads, worker/training/checkpointing.py);
- its GangWatch heartbeats its seat; once the seat is gone (the attempt ended, failed, was cancelled
  or released, or rank 0's lease ran out) its processes are killed at once (SIGKILL: it writes
  nothing more, a paused member that wakes included);
- when its processes end first (the job finished, or they failed), it keeps its seat until rank 0
  closes the gang, so that rank 0 records one outcome for the attempt and never mistakes a finished
  member for a lost one;
- on its worker's shutdown it kills its processes and leaves its seat (gangs.leave), so that rank 0
  ends the attempt at its next look rather than after a lease.

Its job folder on this machine is scratch (tokenised data, a fetched checkpoint, its processes'
staging folders): removed at the end when the job's files live in an object store.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path

from shared import jobs_repo
from shared.core.config import Settings
from shared.core.tables import Job, JobGang, JobStatus
from shared.jobs_repo import gangs
from shared.jobs_repo.gangs import Seat
from shared.scheduling.optional_tables import has_table
from worker.fleet.gang_watch import GangWatch
from worker.fleet.health import DatabaseWatch
from worker.fleet.launch import ChildProcess, terminate
from worker.fleet.outcome import log_dir
from worker.fleet.supervisor import JobOutcome, Stop
from worker.training.job_storage import JobStorage

logger = logging.getLogger(__name__)

# Starts a member's processes: (job, its devices, its log, its seat) → the running child.
MemberLauncher = Callable[[Job, list[str], Path, Seat], ChildProcess]
# How much of a member's log its worker's log repeats when its processes fail.
TAIL_CHARS = 2000


class GangMember:
    """Runs one machine's part (rank > 0) of a gang's attempt; `start()` runs it on a thread."""

    def __init__(
        self,
        job: Job,
        seat: Seat,
        devices: list[str],
        *,
        settings: Settings,
        db: DatabaseWatch,
        launch: MemberLauncher,
        stopping: threading.Event,
        on_done: Callable[[GangMember], None],
    ) -> None:
        self.job, self.seat, self.devices = job, seat, devices
        self.settings, self.db = settings, db
        self._launch, self._stopping, self._on_done = launch, stopping, on_done
        self.storage = JobStorage.of(settings, job.id)
        self.outcome: JobOutcome | None = None
        self._lost = threading.Event()
        self.thread = threading.Thread(target=self.run, name=f"gang-{job.id}-{seat.rank}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def run(self) -> JobOutcome:
        seat = self.seat
        watch = GangWatch(
            self.db,
            seat,
            lease_s=self.settings.lease_s,
            interval_s=self.settings.heartbeat_s,
            on_lost=lambda _reason: self._lost.set(),
        )
        watch.start()
        try:
            folder = log_dir(self.storage.local)
            folder.mkdir(parents=True, exist_ok=True)
            log_path = folder / f"attempt-{seat.attempt}-machine-{seat.rank}.log"
            logger.info(
                "job %s: machine rank %d of %d on %s (rendezvous %s:%d), log %s",
                seat.job_id, seat.rank, seat.size, ",".join(self.devices), seat.address, seat.port, log_path,
            )  # fmt: skip
            child = self._launch(self.job, self.devices, log_path, seat)
            returncode = self._supervise(child)
            if returncode not in (0, None) and not self._lost.is_set():
                tail = log_path.read_text(errors="replace")[-TAIL_CHARS:] if log_path.is_file() else ""
                logger.warning(
                    "job %s: machine rank %d's processes exited %s; their log ends:\n%s",
                    seat.job_id, seat.rank, returncode, tail,
                )  # fmt: skip
            # Keep the seat until rank 0 ends the attempt (or the worker stops).
            while not self._lost.is_set() and not self._stopping.is_set():
                self._lost.wait(self.settings.heartbeat_s)
            if self._stopping.is_set() and not self._lost.is_set():
                self._leave()
        except Exception:
            logger.exception("job %s: machine rank %d could not run its part", seat.job_id, seat.rank)
            self._leave()
        finally:
            watch.stop()
            self.storage.remove_local()
            self.outcome = JobOutcome(self.job.id, None, stopped=Stop.member)
            self._on_done(self)
        return self.outcome

    def _supervise(self, child: ChildProcess) -> int | None:
        """Wait for the child; kill it at once when the seat is gone or the worker stops."""
        while (returncode := child.wait(self.settings.heartbeat_s)) is None:
            if self._lost.is_set() or self._stopping.is_set():
                why = "its seat is gone" if self._lost.is_set() else "the worker is stopping"
                logger.info(
                    "job %s: stopping machine rank %d's processes (%s)", self.job.id, self.seat.rank, why
                )
                # Nothing of a member may be written once its attempt has ended: no grace.
                terminate(child, grace_s=0.0, first=signal.SIGKILL)
                return None  # on a worker's stop, `run` then leaves the seat
        return returncode

    def _leave(self) -> None:
        try:
            with self.db.session() as session:
                gangs.leave(session, self.seat)
        except Exception as exc:  # rank 0 finds it silent after a lease instead
            logger.warning("job %s: could not leave its gang: %s", self.job.id, exc)


def join_and_read(db: DatabaseWatch, *, worker_id: str, free: int, lease_s: float) -> tuple[Seat, Job] | None:
    """The seat this worker takes in an open gang that fits `free` devices, and the job as its
    rank 0 claimed it (whose claim its processes carry); None when there is none to join."""
    with db.session() as session:
        if not has_table(session, JobGang.__tablename__):
            return None  # a database before migration 0017 (a fleet mid-upgrade): no gangs
        seat = gangs.join_gang(session, worker_id=worker_id, max_processes=free, lease_s=lease_s)
        if seat is None:
            return None
        job = jobs_repo.get_job(session, job_id=seat.job_id)
    if job.attempts != seat.attempt or job.status != JobStatus.running or not job.worker_id:
        return None  # the attempt ended as it was joined: its seat is void already
    return seat, job
