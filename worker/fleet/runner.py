"""The worker: claim jobs while devices are free → run each in a child process under a supervisor
thread → record the outcomes.

The loop is control flow only; every database access is a jobs_repo call. A worker holds a set of
devices (GPUs, or CPU slots; worker/fleet/devices.py) and claims only jobs whose `num_processes` fits in
what is free, so it runs as many jobs at once as its devices allow. Each running job has its own
JobSupervisor thread (worker/fleet/supervisor.py) that heartbeats its lease.

Nothing here imports torch: the parent stays small, and a job's crash, out-of-memory kill or cancel
ends only its child. SIGTERM/SIGINT stop taking work; running jobs are asked for a checkpoint at
their next step and put back in the queue (without spending an attempt), and the next worker resumes
each from that checkpoint.

The worker outlives its database: a step of the loop that cannot reach it (lease recovery, claim,
registration) is logged and retried after a capped, jittered backoff, while the supervisors keep
heartbeating their jobs as soon as the database answers again. `ready` says whether the last
round trip of the worker (loop or heartbeat) reached the database (the health port's /readyz).

Its disk (worker/training/disk_space.py): below GLUEJOBS_WORKER_MIN_FREE_BYTES on the disk of its artifacts
or cache folder, the worker claims nothing (state low_disk on its row, /readyz 503 "low_disk") until
it has room again; its running jobs go on. Every job it takes would fail on a full disk.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from secrets import token_hex
from types import FrameType

from shared import jobs_repo
from shared.core import build, release
from shared.core.config import Settings
from shared.core.db import Database, read
from shared.core.db_retries import Backoff, is_transient
from shared.core.tables import Job, WorkerState
from shared.jobs_repo.gangs import Seat
from shared.jobspec.capability import known_fields, read_spec
from shared.scheduling.fair_share import ClaimPolicy
from worker.fleet.devices import DevicePool, cpu_slots
from worker.fleet.gang_member import GangMember, join_and_read
from worker.fleet.health import DatabaseWatch
from worker.fleet.launch import (
    ChildProcess,
    MachineRank,
    SubprocessChild,
    child_args,
    child_command,
    child_environment,
    gang_command,
    job_child_environment,
)
from worker.fleet.supervisor import JobOutcome, JobSupervisor, Stop
from worker.fleet.warm import WarmStarter
from worker.training.checkpoints import ATTEMPT_ENV
from worker.training.disk_space import DiskState, disk_state

__all__ = ["JobOutcome", "Stop", "Worker", "child_environment"]


def worker_version() -> str:
    """This worker's release and build, "0.2.0+1a2b3c4d5e6f" (GET /v1/workers shows both: two builds
    of one release are told apart, and a fleet mid-upgrade is visible)."""
    return build.version_string()


# How many refused jobs a worker remembers not to claim again (a bounded skip list: past it, the
# oldest is forgotten, claimed once more and refused once more, which costs one claim).
MAX_REFUSED = 1000


logger = logging.getLogger(__name__)


class Worker:
    def __init__(
        self,
        settings: Settings,
        db: Database | None = None,
        *,
        worker_id: str | None = None,
        devices: Sequence[str] | None = None,
    ) -> None:
        self.settings = settings
        self.db = db or Database(settings.database_url)
        # Every round trip goes through it: it knows whether the last one reached the database.
        self.database = DatabaseWatch(self.db)
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{token_hex(3)}"
        self.pool = DevicePool(devices or cpu_slots(1))
        self.claim_policy = ClaimPolicy.from_settings(settings)  # fair share, quotas, reservations
        # Single-process jobs fork from a template with torch imported (worker/fleet/warm.py).
        self.warm = WarmStarter() if settings.warm_start else None
        self._stopping = threading.Event()
        self._wake = threading.Event()  # set when a job finishes or the worker is told to stop
        self._lock = threading.Lock()
        self._running: dict[int, JobSupervisor | GangMember] = {}
        self._finished: list[JobSupervisor | GangMember] = []
        self._started = 0
        self._registered = False
        self._loop_failing = False  # whether the loop's last database access failed (for its log)
        self._backoff = Backoff(base_s=min(1.0, settings.poll_interval_s), cap_s=30.0)
        self._touched_at = 0.0
        self._state: WorkerState | None = None
        # Why this release stopped claiming (the database needs another one), once it did.
        self.refusal: str | None = None
        self.disk: DiskState | None = None  # its job disk at the loop's last look
        # Jobs this build handed back because it cannot run them (oldest first), never claimed again;
        # and the spec fields it was asked for and lacks (for its log and GET /v1/workers' reader).
        self.refused: dict[int, str] = {}
        self.missing_fields: set[str] = set()

    # --- the loop -----------------------------------------------------------------------------------

    def run(self, *, exit_when_idle: bool = False, max_jobs: int | None = None) -> list[JobOutcome]:
        """Work until stopped (or, with exit_when_idle, until nothing is queued that fits and nothing
        runs; with max_jobs, until that many jobs have run). An unreachable database never ends it."""
        if self.warm is not None:
            self.warm.start()
            while not self._stopping.is_set() and not self.warm.wait_ready(self.settings.poll_interval_s):
                pass  # no claim before the template forks (worker/fleet/warm.py)
        outcomes: list[JobOutcome] = []
        try:
            while not self._stopping.is_set():
                self._wake.clear()
                outcomes += self._collect_finished()
                try:
                    if not self._registered:
                        self._register()
                    self._look_at_disk()
                    self._touch()
                    if self.refusal is not None:
                        if not self._busy():
                            break  # drained: its running jobs finished
                    elif max_jobs is not None and self._started >= max_jobs:
                        if not self._busy():
                            break
                    elif self.pool.free and self._claim_and_start():
                        continue  # fill the next free device at once
                    elif exit_when_idle and not self._busy() and not self._retry_pending():
                        self._warn_about_jobs_too_wide()
                        break
                except Exception as exc:
                    if not is_transient(exc):
                        raise
                    self._database_away(exc)
                    continue
                self._database_back()
                self._wake.wait(self.settings.poll_interval_s)
        finally:
            self._stopping.set()  # every supervisor hands its job back
            self._set_state(WorkerState.draining)
            self._join_all()
            outcomes += self._collect_finished()
            self._unregister(len(outcomes))
        return outcomes

    def _warn_about_jobs_too_wide(self) -> None:
        with self.database.session() as session:
            too_wide = jobs_repo.queued_wider_than(session, processes=len(self.pool.devices))
        if too_wide:
            logger.warning(
                "worker %s: job(s) %s stay queued: they need more than this worker's %d device(s) "
                "(start a worker with more --devices, or --slots on the CPU)",
                self.worker_id,
                ", ".join(map(str, too_wide)),
                len(self.pool.devices),
            )

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def wait_stopping(self, timeout_s: float) -> bool:
        return self._stopping.wait(timeout_s)

    def status(self) -> dict[str, object]:
        """What the health port answers."""
        with self._lock:
            jobs = sorted(self._running)
        disk = self.disk
        return {
            "worker_id": self.worker_id,
            "database_reachable": self.database.reachable,
            "low_disk": disk is not None and disk.low,
            "disk": disk.as_dict() if disk is not None else None,
            "draining": self._stopping.is_set(),
            "jobs": jobs,
            "devices": self.pool.devices,
        }

    def _database_away(self, exc: BaseException) -> None:
        delay = self._backoff.next_delay()
        if not self._loop_failing or self._backoff.failures == 1 or self._backoff.failures % 10 == 0:
            logger.warning(
                "worker %s: the database is unreachable (try %d); waiting %.1fs: %s",
                self.worker_id,
                self._backoff.failures,
                delay,
                str(exc).splitlines()[0][:200],
            )
        self._loop_failing = True
        self._stopping.wait(delay)

    def _database_back(self) -> None:
        if self._loop_failing and self._backoff.failures:
            logger.info("worker %s: the database is reachable again", self.worker_id)
        self._loop_failing = False
        self._backoff.reset()

    def _touch(self) -> None:
        """The worker's own heartbeat (and state) on its row, at most every heartbeat_s: an idle
        worker's poll costs a read, and this small write now and then."""
        state = WorkerState.busy if self._busy() else WorkerState.idle
        if self.disk is not None and self.disk.low:
            state = WorkerState.low_disk  # it takes no work until it has room (its jobs run on)
        if self.refusal is not None:
            state = WorkerState.draining  # it takes no more work
        now = time.monotonic()
        if state == self._state and now - self._touched_at < max(
            self.settings.heartbeat_s, self.settings.lease_s / 4
        ):
            return
        with self.database.session() as session:
            jobs_repo.touch_worker(session, worker_id=self.worker_id, state=state)
        self._state, self._touched_at = state, now

    def _look_at_disk(self) -> None:
        """Its job disk now (one statvfs a folder), and a log line when it crosses the floor."""
        was_low = self.disk is not None and self.disk.low
        try:
            self.disk = disk_state(self.settings)
        except OSError as exc:  # a folder it cannot stat: it cannot write there either
            logger.error("worker %s: cannot read its disk's free space: %s", self.worker_id, exc)
            self.disk = DiskState(free_bytes=0, floor_bytes=max(1, self.settings.worker_min_free_bytes))
        if self.disk.low and not was_low:
            logger.warning(
                "worker %s stops claiming: %s (GLUEJOBS_WORKER_MIN_FREE_BYTES); it claims again once "
                "it has room",
                self.worker_id,
                self.disk.describe(),
            )
        elif was_low and not self.disk.low:
            logger.info("worker %s claims again: %s", self.worker_id, self.disk.describe())

    def _set_state(self, state: WorkerState) -> None:
        try:
            with self.database.session() as session:
                jobs_repo.touch_worker(session, worker_id=self.worker_id, state=state)
            self._state = state
        except Exception as exc:
            logger.warning("worker %s: could not record its state %s: %s", self.worker_id, state, exc)

    def stop(self) -> None:
        """Stop taking work; running jobs are handed back to the queue."""
        self._stopping.set()
        self._wake.set()

    def install_signal_handlers(self) -> None:
        def handle(signum: int, _frame: FrameType | None) -> None:
            logger.info("received %s: stopping", signal.Signals(signum).name)
            self.stop()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    def _register(self) -> None:
        with self.database.session() as session:
            jobs_repo.register_worker(
                session,
                worker_id=self.worker_id,
                host=socket.gethostname(),
                pid=os.getpid(),
                devices=self.pool.devices,
                version=worker_version(),
                build=build.build_record(known_fields(), release.schema_head()),
            )
            jobs_repo.prune_workers(session)
        self._registered, self._state, self._touched_at = True, WorkerState.idle, time.monotonic()
        logger.info("worker %s started on %s", self.worker_id, ",".join(self.pool.devices))

    def _unregister(self, jobs: int) -> None:
        try:
            if self._registered:
                with self.database.session() as session:
                    jobs_repo.worker_stopped(session, worker_id=self.worker_id)
        except Exception as exc:  # the database is away: the row goes "gone" after a lease
            logger.warning("worker %s: could not say goodbye: %s", self.worker_id, exc)
        finally:
            logger.info("worker %s stopped after %d job(s)", self.worker_id, jobs)

    # --- claiming -----------------------------------------------------------------------------------

    def _claim_and_start(self) -> bool:
        """Claim a job that fits in the free devices and start its supervisor; False if none did (or
        the database was migrated for a release this one does not fit: it then drains)."""
        if not self._fits_database():
            return False
        self._recover_expired_leases()
        if self.disk is not None and self.disk.low:
            return False  # no room for a job's files (the loop logged it)
        if self._join_gang():
            return True  # a gang waiting for machines comes before a claim of its own
        free = self.pool.free
        started = time.perf_counter()
        with self.database.session() as session:
            job = jobs_repo.claim_next(
                session,
                worker_id=self.worker_id,
                lease_s=self.settings.lease_s,
                max_processes=free,
                capacity=len(self.pool.devices),  # a wide job may reserve this worker (reservations.py)
                policy=self.claim_policy,
                skip=self.refused.keys(),
            )
        if job is None:
            return False
        if self._refuse_if_unable(job):
            return True  # handed back: look for the next job at once
        # bench/fleet_bench.py reads the claim's duration from this line.
        logger.info(
            "claimed job %s (attempt %d) in %.1f ms",
            job.id,
            job.attempts,
            1000 * (time.perf_counter() - started),
        )
        devices = self.pool.take(job.num_processes)
        supervisor = JobSupervisor(
            job,
            devices,
            settings=self.settings,
            db=self.database,
            worker_id=self.worker_id,
            launch=self.launch,
            stopping=self._stopping,
            on_done=self._job_done,
            launch_gang=self.launch_gang,
        )
        with self._lock:
            self._running[job.id] = supervisor
            self._started += 1
        supervisor.start()
        return True

    def _join_gang(self) -> bool:
        """Take a seat in an open gang (a job of several machines whose rank 0 waits for machines)
        that fits the free devices, and start this machine's part of it; False if there is none."""
        joined = join_and_read(
            self.database, worker_id=self.worker_id, free=self.pool.free, lease_s=self.settings.lease_s
        )
        if joined is None:
            return False
        seat, job = joined
        logger.info(
            "joined the gang of job %s (attempt %d) as machine rank %d of %d",
            job.id, seat.attempt, seat.rank, seat.size,
        )  # fmt: skip
        member = GangMember(
            job,
            seat,
            self.pool.take(job.num_processes),
            settings=self.settings,
            db=self.database,
            launch=self.launch_gang,
            stopping=self._stopping,
            on_done=self._job_done,
        )
        with self._lock:
            self._running[job.id] = member
            self._started += 1
        member.start()
        return True

    def _refuse_if_unable(self, job: Job) -> bool:
        """Whether this build cannot run the job it claimed, judged from the job's spec
        (shared/jobspec/capability.py); if so the job goes back untouched, with an event naming this
        build and why, and this worker never claims it again (a build that can run it will)."""
        verdict = read_spec(job.spec)
        if verdict.refusal is None:
            return False
        claim = jobs_repo.Claim(job.id, self.worker_id, job.attempts)
        with self.database.session() as session:
            jobs_repo.refuse_job(
                session, claim=claim, build=build.describe(), reason=verdict.refusal, missing=verdict.missing
            )
        self.refused[job.id] = verdict.refusal
        while len(self.refused) > MAX_REFUSED:
            del self.refused[next(iter(self.refused))]
        self.missing_fields.update(verdict.missing)
        logger.warning(
            "worker %s of %s handed job %s back without running it: %s",
            self.worker_id,
            build.describe(),
            job.id,
            verdict.refusal,
        )
        return True

    def _fits_database(self) -> bool:
        """Whether this release may still claim: asked before every claim, since the database may be
        migrated under a running worker (shared/core/release.py)."""
        with self.database.session() as session, read(session):
            reason = release.misfit(session.connection())
        if reason is None:
            return True
        self.refusal = reason
        running = len(self._running)
        logger.error(
            "worker %s stops claiming: %s (it ends after its %d running job(s))",
            self.worker_id,
            reason,
            running,
        )
        self._set_state(WorkerState.draining)
        return False

    def _retry_pending(self) -> bool:
        with self.database.session() as session:
            return jobs_repo.retry_pending(session, max_processes=len(self.pool.devices))

    def _recover_expired_leases(self) -> None:
        with self.database.session() as session:
            for expired in jobs_repo.recover_expired_leases(
                session,
                retry_base_s=self.settings.retry_backoff_s,
                retry_cap_s=self.settings.retry_backoff_max_s,
            ):
                logger.warning(
                    "job %s: its worker stopped heartbeating; %s",
                    expired.job_id,
                    "requeued" if expired.requeued else "no attempts left",
                )

    # --- running jobs -------------------------------------------------------------------------------

    def launch(self, job: Job, devices: list[str], log_path: Path) -> ChildProcess:
        """Start a job's child: forked from the warm template when it can be, else in a fresh
        interpreter (one process, or `accelerate launch` for several)."""
        env = job_child_environment(self.settings, job, devices, self.pool.devices)
        if self.warm is not None and self.warm.serves(job):
            return self.warm.launch(child_args(job, worker_id=self.worker_id), env, log_path)
        return SubprocessChild(child_command(job, worker_id=self.worker_id), env, log_path)

    def launch_gang(self, job: Job, devices: list[str], log_path: Path, seat: Seat) -> ChildProcess:
        """Start this machine's part of a job of several machines: `accelerate launch` with its
        machine rank and rank 0's rendezvous, carrying rank 0's claim (the job's worker). Never warm:
        the launcher starts fresh interpreters anyway."""
        env = job_child_environment(self.settings, job, devices, self.pool.devices)
        env[ATTEMPT_ENV] = str(seat.attempt)
        machine = MachineRank(rank=seat.rank, machines=seat.size, address=seat.address, port=seat.port)
        claim_worker = self.worker_id if seat.rank == 0 else str(job.worker_id)
        return SubprocessChild(
            gang_command(job, claim_worker_id=claim_worker, machine=machine), env, log_path
        )

    def _job_done(self, supervisor: JobSupervisor | GangMember) -> None:
        """Called on the supervisor's thread when its job has ended and been recorded."""
        with self._lock:
            self._running.pop(supervisor.job.id, None)
            self._finished.append(supervisor)
        self.pool.give_back(supervisor.devices)
        self._wake.set()

    def _busy(self) -> bool:
        with self._lock:
            return bool(self._running)

    def _collect_finished(self) -> list[JobOutcome]:
        with self._lock:
            finished, self._finished = self._finished, []
        for supervisor in finished:
            supervisor.thread.join()
        return [s.outcome for s in finished if s.outcome is not None]

    def _join_all(self) -> None:
        with self._lock:
            running = list(self._running.values())
        for supervisor in running:
            supervisor.thread.join()
