"""One running job, supervised from a thread of the worker: start its child, heartbeat its lease,
stop it on cancel / lost lease / timeout / shutdown, and record the outcome.

A worker runs one JobSupervisor per running job, each on its own thread, so each job's lease is
renewed on its own schedule and a slow job never delays another's heartbeat. Every database access
is a jobs_repo call in its own short transaction.

The database may go away at any moment. A heartbeat that fails is retried at the next beat; the
child keeps training (its own writes wait in its flusher). Only once a whole lease has passed
without a heartbeat is the job taken to be lost: the lease has run out, another worker may hold it,
so the child is stopped and nothing is recorded. Recording the outcome retries for the same time.

With an object store (worker/training/job_storage.py) the attempt's log is copied there while the job runs
(one try between heartbeats, never holding one up) and once more when it ends; then the job's
folder on this machine goes, since everything in it that counts is in the store.

Shutdown (SIGTERM to the worker): the child is asked (SIGTERM) to save a checkpoint at its next
step boundary; it exits with PREEMPTED_EXIT and the job is handed back without spending an
attempt. After cancel_grace_s it is killed and handed back all the same.

Resources (issue 34): an attempt that died because this worker ran out of disk or memory
(outcome.RESOURCE_CODES; the disk's state and the kernel's OOM kill count are the worker's own view,
read as the child ends) is handed back without spending an attempt, a bounded number of times
(GLUEJOBS_MAX_RESOURCE_HANDBACKS); the worker's loop claims nothing more while its disk is low.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import TypeVar

from shared import jobs_repo
from shared.core.config import Settings
from shared.core.db_retries import Backoff, is_transient
from shared.core.tables import ErrorCode, Job, JobStatus
from shared.jobs_repo import gangs
from shared.jobs_repo.gangs import Seat
from shared.jobspec.capability import runnable_spec
from shared.jobspec.spec import JobSpec
from shared.scheduling.machines import machines_of
from worker.fleet.db_reporter import OUTAGE_LOG_INTERVAL_S, STALE_EXIT
from worker.fleet.gang_watch import GangWatch, wait_until_full
from worker.fleet.health import DatabaseWatch
from worker.fleet.launch import (
    ChildProcess,
    advertised_address,
    gang_ports,
    reserve_port,
    terminate,
)
from worker.fleet.liveness import ORPHANED_EXIT
from worker.fleet.outcome import (
    PREEMPTED_EXIT,
    RESOURCE_CODES,
    TAIL_HEADING,
    clear_errors,
    kernel_oom_kills,
    log_dir,
    read_failure,
    reserve_error_files,
)
from worker.training.disk_space import disk_state
from worker.training.job_storage import JobStorage
from worker.training.user_text import Places, for_users, places_of

logger = logging.getLogger(__name__)

T = TypeVar("T")
# How often a running job's log is copied to an object store.
LOG_COPY_INTERVAL_S = 10.0


class Stop(StrEnum):
    """Why the runner stopped a child before it finished."""

    cancelled = "cancelled"
    lease_lost = "lease_lost"
    shutdown = "shutdown"
    timeout = "timeout"
    resource = "resource"  # it died for want of the worker's disk or memory: handed back
    # Jobs of several machines (issue 37):
    gang_lost = "gang_lost"  # rank 0: another machine of the gang stopped or fell silent
    unfilled = "unfilled"  # rank 0: the gang was not full in time; the job went back to the queue
    member = "member"  # a member's part ended; rank 0 records the job's outcome


@dataclass(frozen=True)
class JobOutcome:
    job_id: int
    # None when the job was handed back (shutdown, resource) or taken away (lease lost)
    status: JobStatus | None
    error: str | None = None
    stopped: Stop | None = None
    error_code: ErrorCode | None = None


# Starts a job's child: (job, its devices, its attempt log) → the running child.
Launcher = Callable[[Job, list[str], Path], ChildProcess]
# Starts one machine's part of a job of several machines: the same, and the machine's seat.
GangLauncher = Callable[[Job, list[str], Path, Seat], ChildProcess]


class JobSupervisor:
    """Runs one claimed job to its outcome; `start()` runs it on a thread of its own."""

    def __init__(
        self,
        job: Job,
        devices: list[str],
        *,
        settings: Settings,
        db: DatabaseWatch,
        worker_id: str,
        launch: Launcher,
        stopping: threading.Event,
        on_done: Callable[[JobSupervisor], None],
        launch_gang: GangLauncher | None = None,
    ) -> None:
        self.job = job
        self.devices = devices
        self.settings = settings
        self.db = db
        self.worker_id = worker_id
        # Every write of this attempt is fenced by it: once the job is another's, they change nothing.
        self.claim = jobs_repo.Claim(job.id, worker_id, job.attempts)
        self._launch = launch
        self._stopping = stopping  # the worker's: set on shutdown
        self._on_done = on_done
        self.outcome: JobOutcome | None = None
        self.thread = threading.Thread(target=self.run, name=f"job-{job.id}", daemon=True)
        self._last_beat = time.monotonic()  # the claim renewed the lease
        self._beat_failing = False
        self._logged_silence = 0.0
        self.storage = JobStorage.of(settings, job.id)
        self._log_copied_at = 0.0
        self._log_copied_size = -1
        self._oom_kills_before: int | None = None
        # A job of several machines: this worker is its rank 0 (worker/fleet/gang_member.py: the others).
        self._machines = machines_of(job.spec)
        self._launch_gang = launch_gang
        self._seat: Seat | None = None
        self._reserved: socket.socket | None = None  # the rendezvous port, held until the launch
        self._gang_watch: GangWatch | None = None

    def start(self) -> None:
        self.thread.start()

    def run(self) -> JobOutcome:
        job = self.job
        output_dir = self.storage.local
        log_path: Path | None = None
        outcome = JobOutcome(
            job.id,
            JobStatus.failed,
            "the worker failed before the job started",
            error_code=ErrorCode.internal,
        )
        try:
            log_path = self._prepare(output_dir)
            logger.info(
                "job %s: attempt %d on %s, log %s", job.id, job.attempts, ",".join(self.devices), log_path
            )
            unformed = self._form_gang() if self._machines > 1 else None
            if unformed is not None:
                outcome = unformed
            else:
                child = self._launch_beating(log_path)
                self._watch_gang()
                stopped = self._supervise(child, log_path)
                returncode = child.wait(None)
                assert returncode is not None
                if returncode != 0 and stopped is None and self._gang_watch is not None:
                    stopped = self._await_member_loss()
                outcome = self._outcome(output_dir, log_path, returncode, stopped)
        except _LeaseLost:
            outcome = JobOutcome(job.id, None, stopped=Stop.lease_lost)
        except Exception as exc:  # the worker survives any one job's failure
            logger.exception("job %s: the worker could not run it", job.id)
            outcome = JobOutcome(
                job.id,
                JobStatus.failed,
                f"the worker could not run the job: {exc}",
                error_code=ErrorCode.internal,
            )
        finally:
            # The whole log is in the store before the outcome is known, when the store answers at
            # once; else it is waited for after the outcome is recorded (which must not wait).
            copied = log_path is not None and self._copy_log(log_path, final=True)
            self._record(outcome)
            self._end_gang()
            if log_path is not None:
                self._keep_files(log_path, copied=copied)
            self.outcome = outcome
            self._on_done(self)
        return outcome

    def _keep_files(self, log_path: Path, *, copied: bool) -> None:
        """The attempt's log into the store (unless it is there already), then the job's folder
        here goes (an object store)."""
        try:
            if not copied:
                self.storage.upload_log(log_path)
        except Exception as exc:  # the outcome is recorded: a log lost to the store is not the job's
            logger.warning("job %s: could not copy its log to the store: %s", self.job.id, exc)
        self.storage.remove_local()

    def _copy_log(self, log_path: Path, *, final: bool = False) -> bool:
        """The job's log into the store, in one try (the heartbeat comes first): while it runs, every
        LOG_COPY_INTERVAL_S when it has grown; `final`, once more at its end. Whether it is there."""
        if not self.storage.mirrored:
            return True
        if not final and time.monotonic() - self._log_copied_at < LOG_COPY_INTERVAL_S:
            return False
        self._log_copied_at = time.monotonic()
        try:
            size = log_path.stat().st_size
            if size != self._log_copied_size:
                self.storage.upload_log(log_path, once=True)
                self._log_copied_size = size
            return True
        except Exception as exc:  # the store is away: the next copy, or the last, brings it
            logger.debug("job %s: its log was not copied this time: %s", self.job.id, exc)
            return False

    def _prepare(self, output_dir: Path) -> Path:
        """The job's folder and its attempt's log; the job row learns both and its devices."""
        log_dir(output_dir).mkdir(parents=True, exist_ok=True)
        clear_errors(output_dir)
        # Taken while the disk has room: a child that dies of a full disk can still say why.
        reserve_error_files(output_dir, self.job.num_processes)
        self._oom_kills_before = kernel_oom_kills()

        def store() -> None:
            with self.db.session() as session:
                jobs_repo.set_output_dir(
                    session, claim=self.claim, output_dir=self.storage.location, devices=self.devices
                )

        self._while_leased(store, "record where the job runs")
        return log_dir(output_dir) / f"attempt-{self.job.attempts}.log"

    def _launch_beating(self, log_path: Path) -> ChildProcess:
        """Start the child, heartbeating meanwhile: a start can take longer than a lease (the first
        fork waits for the warm template's imports; eight workers importing torch at once on two
        cores took over a minute in bench/fleet_bench.py), and the lease must not run out under it."""
        done = threading.Event()

        def beat() -> None:
            while not done.wait(self.settings.heartbeat_s):
                self._heartbeat()

        beater = threading.Thread(target=beat, name=f"job-{self.job.id}-start", daemon=True)
        beater.start()
        try:
            if self._seat is not None:
                assert self._launch_gang is not None, "a job of several machines needs a gang launcher"
                if self._reserved is not None:
                    # Let go of the rendezvous port only now: rank 0's launcher binds it at once.
                    self._reserved.close()
                    self._reserved = None
                return self._launch_gang(self.job, self.devices, log_path, self._seat)
            return self._launch(self.job, self.devices, log_path)
        finally:
            done.set()
            beater.join()

    # --- while the child runs -----------------------------------------------------------------------

    def _supervise(self, child: ChildProcess, log_path: Path) -> Stop | None:
        """Heartbeat while the child runs; stop it on cancel, a lost lease, a timeout or shutdown."""
        started = time.monotonic()
        max_runtime_s = self.job.spec.get("max_runtime_s")
        while child.wait(self.settings.heartbeat_s) is None:
            if self._stopping.is_set():
                self._preempt(child)
                return Stop.shutdown
            stop = self._heartbeat()
            if stop is None and self._gang_watch is not None and self._gang_watch.member_lost:
                stop = Stop.gang_lost
            self._copy_log(log_path)
            if (
                stop is None
                and max_runtime_s is not None
                and time.monotonic() - started > float(max_runtime_s)
            ):
                stop = Stop.timeout
            if stop is not None:
                logger.info("job %s: stopping its process (%s)", self.job.id, stop)
                if stop == Stop.lease_lost:
                    # Another attempt may own the job's folder now: no checkpoint, no last write.
                    terminate(child, grace_s=0.0, first=signal.SIGKILL)
                else:  # cancel, timeout: stop at once (SIGINT), no checkpoint to wait for
                    terminate(child, grace_s=self.settings.cancel_grace_s, first=signal.SIGINT)
                return stop
        return None

    def _preempt(self, child: ChildProcess) -> None:
        """Ask the child for a checkpoint at its next step boundary; kill it after the grace period.
        The heartbeat goes on meanwhile: a checkpoint of a large model takes a while."""
        logger.info("job %s: the worker is stopping: asking for a checkpoint", self.job.id)
        child.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + self.settings.cancel_grace_s
        while child.wait(min(self.settings.heartbeat_s, max(0.0, deadline - time.monotonic()))) is None:
            if time.monotonic() >= deadline:
                logger.warning(
                    "job %s: no checkpoint within %.0fs: killing it",
                    self.job.id,
                    self.settings.cancel_grace_s,
                )
                child.signal_group(signal.SIGKILL)
                child.wait(None)
                return
            self._heartbeat()

    def _heartbeat(self) -> Stop | None:
        try:
            with self.db.session() as session:
                status = jobs_repo.heartbeat(session, claim=self.claim, lease_s=self.settings.lease_s)
        except Exception as exc:  # the database is away: the job trains on; try again next beat
            silent_s = time.monotonic() - self._last_beat
            if not self._beat_failing or silent_s - self._logged_silence >= OUTAGE_LOG_INTERVAL_S:
                logger.warning(
                    "job %s: heartbeat failed (%.0fs since the last one; the lease is %.0fs): %s",
                    self.job.id,
                    silent_s,
                    self.settings.lease_s,
                    str(exc).splitlines()[0][:200],
                )
                self._logged_silence = silent_s
            self._beat_failing = True
            # A whole lease without a heartbeat: the lease has run out and the job may be another
            # worker's now. (The child's writes are refused from then on anyway.)
            return Stop.lease_lost if silent_s >= self.settings.lease_s else None
        if self._beat_failing:
            logger.info(
                "job %s: heartbeat renewed after %.1fs", self.job.id, time.monotonic() - self._last_beat
            )
        self._last_beat, self._beat_failing, self._logged_silence = time.monotonic(), False, 0.0
        if status is None:
            return Stop.lease_lost
        return Stop.cancelled if status == JobStatus.cancelling else None

    # --- a job of several machines: this worker is rank 0 --------------------------------------------

    def _form_gang(self) -> JobOutcome | None:
        """Reserve the rendezvous, open the gang and wait for the other machines to join, renewing
        the job's lease meanwhile. None once the gang is full; else the outcome: released unfilled
        (back in the queue, no attempt spent), cancelled, handed back on shutdown, or the lease lost."""
        settings, job = self.settings, self.job
        address = advertised_address(settings)
        self._reserved = reserve_port(address, gang_ports(settings))
        port = int(self._reserved.getsockname()[1])
        with self.db.session() as session:
            seat = gangs.open_gang(session, claim=self.claim, size=self._machines, address=address, port=port)
        if seat is None:
            raise _LeaseLost
        self._seat = seat
        logger.info(
            "job %s: opened a gang of %d machines (rendezvous %s:%d); waiting up to %.0fs for it to fill",
            job.id, self._machines, address, port, settings.gang_fill_s,
        )  # fmt: skip
        why: list[Stop] = []
        beaten = time.monotonic()

        def waiting() -> str | None:
            nonlocal beaten
            if self._stopping.is_set():
                why.append(Stop.shutdown)
            elif time.monotonic() - beaten >= settings.heartbeat_s:
                beaten = time.monotonic()
                stop = self._heartbeat()
                if stop is not None:
                    why.append(stop)
            return why[-1] if why else None

        if wait_until_full(self.db, seat, bound_s=settings.gang_fill_s, waiting=waiting):
            return None
        self._seat = None  # closed or released by the wait
        if not why:
            logger.info(
                "job %s: its gang was not full within %.0fs: back in the queue", job.id, settings.gang_fill_s
            )
            return JobOutcome(job.id, None, stopped=Stop.unfilled)
        if why[-1] == Stop.cancelled:
            return JobOutcome(job.id, JobStatus.cancelled)
        return JobOutcome(job.id, None, stopped=why[-1])

    def _watch_gang(self) -> None:
        if self._seat is None:
            return
        self._gang_watch = GangWatch(
            self.db,
            self._seat,
            lease_s=self.settings.lease_s,
            interval_s=self.settings.heartbeat_s,
            on_lost=lambda _reason: None,  # the supervising loop asks at every heartbeat
        )
        self._gang_watch.start()

    def _await_member_loss(self) -> Stop | None:
        """Rank 0's processes failed: when another machine died (its worker killed, its processes
        gone), they fail first, with a connection error. Whether a member was lost decides whether
        the attempt is the gang's loss (retried) or the job's own failure: wait for the watch to
        tell, up to a lease (a dead worker's seat goes stale within one), renewing the lease."""
        watch = self._gang_watch
        assert watch is not None
        deadline = time.monotonic() + self.settings.lease_s + self.settings.heartbeat_s
        while watch.lost is None and time.monotonic() < deadline:
            stop = self._heartbeat()
            if stop is not None:
                return stop
            self._stopping.wait(min(self.settings.heartbeat_s, 1.0))
        return Stop.gang_lost if watch.member_lost else None

    def _end_gang(self) -> None:
        """After the outcome is recorded: the gang goes, so every member's next heartbeat says stop,
        and nothing of it is left listening."""
        if self._gang_watch is not None:
            self._gang_watch.stop()
        if self._reserved is not None:
            self._reserved.close()
            self._reserved = None
        if self._seat is None:
            return
        try:
            with self.db.session() as session:
                gangs.close_gang(session, self._seat)
        except Exception as exc:  # its members stop anyway once the attempt is no longer running
            logger.warning("job %s: could not close its gang: %s", self.job.id, exc)
        self._seat = None

    # --- the outcome --------------------------------------------------------------------------------

    def _outcome(self, output_dir: Path, log_path: Path, returncode: int, stopped: Stop | None) -> JobOutcome:
        job_id = self.job.id
        if returncode == 0:  # it finished (even while being stopped): that counts
            clear_errors(output_dir)  # the room reserved for error files no rank used
            return JobOutcome(job_id, JobStatus.succeeded)
        if stopped == Stop.gang_lost:
            lost = self._gang_watch.lost if self._gang_watch is not None else None
            return JobOutcome(
                job_id,
                JobStatus.failed,
                lost or "a machine of the gang was lost",
                stopped=stopped,
                error_code=ErrorCode.worker_lost,  # retried: the next attempt is a new gang
            )
        if stopped == Stop.cancelled:
            return JobOutcome(job_id, JobStatus.cancelled)
        if stopped == Stop.timeout:
            limit = self.job.spec.get("max_runtime_s")
            return JobOutcome(
                job_id,
                JobStatus.failed,
                f"the attempt ran longer than max_runtime_s ({limit}s) and was stopped",
                stopped=stopped,
                error_code=ErrorCode.timeout,
            )
        if stopped == Stop.lease_lost or returncode in (STALE_EXIT, ORPHANED_EXIT):
            return JobOutcome(job_id, None, stopped=Stop.lease_lost)
        if stopped == Stop.shutdown or returncode == PREEMPTED_EXIT:
            # Stopped on request (by us, or SIGTERM from outside): hand it back, no attempt spent.
            return JobOutcome(job_id, None, stopped=Stop.shutdown)
        failure = read_failure(
            output_dir,
            returncode,
            log_path,
            disk=disk_state(self.settings, [output_dir]),
            oom_killed=self._oom_killed(),
        )
        if failure.code in RESOURCE_CODES:
            return JobOutcome(job_id, None, failure.message, stopped=Stop.resource, error_code=failure.code)
        return JobOutcome(job_id, JobStatus.failed, failure.message, error_code=failure.code)

    def _oom_killed(self) -> bool:
        """Whether the kernel's OOM killer killed a process of this worker's cgroup while the job ran."""
        after = kernel_oom_kills()
        return self._oom_kills_before is not None and after is not None and after > self._oom_kills_before

    def _record(self, outcome: JobOutcome) -> None:
        job = self.job
        if outcome.error:
            # The operator's log keeps the cause as it was reported (paths and all; the job's log
            # file has the traceback); the job's row gets the text its owner may read.
            cause = outcome.error.split(f"\n\n{TAIL_HEADING}")[0]
            logger.warning("job %s: attempt %d failed: %s", job.id, job.attempts, cause)
            outcome = replace(outcome, error=for_users(outcome.error, self._places()))
        try:
            self._while_leased(lambda: self._store(outcome), "record the outcome")
        except Exception:
            # The lease will expire and another worker will pick the job up again.
            logger.exception("job %s: could not record its outcome", outcome.job_id)
        logger.info(
            "job %s: %s%s",
            job.id,
            outcome.status or outcome.stopped,
            f" [{outcome.error_code}] ({outcome.error.splitlines()[0]})"
            if (outcome.status or outcome.stopped == Stop.resource) and outcome.error
            else "",
        )

    def _places(self) -> Places:
        try:
            spec: JobSpec | None = runnable_spec(self.job.spec)
        except ValueError:  # a spec this version refuses: its folders are still this machine's
            spec = None
        job_dirs = {self.storage.local, self.settings.job_dir(self.job.id)}
        return places_of(self.settings, job_dirs, spec)

    def _store(self, outcome: JobOutcome) -> None:
        job = self.job
        with self.db.session() as session:
            if outcome.status == JobStatus.failed and outcome.error_code is not None:
                status = jobs_repo.fail_job(
                    session,
                    claim=self.claim,
                    error_code=outcome.error_code,
                    error=outcome.error or "",
                    retry_base_s=self.settings.retry_backoff_s,
                    retry_cap_s=self.settings.retry_backoff_max_s,
                )
                recorded = status is not None
            elif outcome.status is not None:
                recorded = jobs_repo.finish_job(
                    session, claim=self.claim, status=outcome.status, error=outcome.error
                )
            elif outcome.stopped == Stop.resource and outcome.error_code is not None:
                status = jobs_repo.hand_back_job(
                    session,
                    claim=self.claim,
                    error_code=outcome.error_code,
                    error=outcome.error or "",
                    max_handbacks=self.settings.max_resource_handbacks,
                    retry_base_s=self.settings.retry_backoff_s,
                    retry_cap_s=self.settings.retry_backoff_max_s,
                )
                recorded = status is not None
            elif outcome.stopped == Stop.shutdown:
                recorded = jobs_repo.release_job(
                    session, claim=self.claim, reason=f"worker {self.worker_id} stopped it at a checkpoint"
                )
            else:
                return
        if not recorded:
            logger.warning("job %s: no longer ours; outcome %s not recorded", job.id, outcome.status)

    def _while_leased(self, action: Callable[[], T], what: str) -> T:
        """`action()`, retried while the database is away, as long as the lease may still hold;
        _LeaseLost after that."""
        backoff = Backoff(base_s=0.2, cap_s=5.0)
        while True:
            try:
                result = action()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                if time.monotonic() - self._last_beat >= self.settings.lease_s:
                    logger.error(
                        "job %s: could not %s within a lease; leaving it to lease recovery", self.job.id, what
                    )
                    raise _LeaseLost from exc
                logger.warning(
                    "job %s: could not %s (retrying): %s", self.job.id, what, str(exc).splitlines()[0][:200]
                )
                time.sleep(backoff.next_delay())
                continue
            return result


class _LeaseLost(Exception):
    """The database stayed away for a whole lease: the job is no longer surely this worker's."""
