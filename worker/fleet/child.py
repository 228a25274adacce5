"""The process that runs one attempt of a job:
`python -m worker.fleet.child --job-id N --worker-id W --attempt A`.

Started by the runner (or by `accelerate launch` for several processes), so that a crash, an
out-of-memory kill or a cancel cannot take the worker down, and GPU memory goes back between jobs.

- It carries its claim (job, worker, attempt): every write is fenced by it (jobs_repo.Claim).
- It watches its worker and exits within moments of the worker's death (worker/fleet/liveness.py).
- The main process reports through a background flusher (worker/fleet/db_reporter.py): the training loop
  never waits on the database, and an outage shorter than the lease costs nothing.
- SIGTERM asks for a checkpoint at the next step boundary; the process then exits with
  PREEMPTED_EXIT and the worker hands the job back without spending an attempt.
- It resumes from the newest checkpoint the database declared, never from a folder it did not
  (worker/training/checkpoints.py): folders nobody declared are removed first, and every step after the
  declared checkpoint is trained and logged again.
- With an object store (GLUEJOBS_STORAGE_URL) it trains in this machine's folder and the store
  holds what counts (worker/training/job_storage.py): uploaded files are fetched into the local cache and
  checked by their sha256, each checkpoint is uploaded before it is declared, a resumed attempt
  fetches its checkpoint from there, and the outputs are uploaded before the job succeeds.
- On failure every process leaves its error and error code in a file the runner reads: in the room
  the worker reserved for it, so that a full disk does not silence it (worker/fleet/outcome.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from shared import jobs_repo
from shared.core.config import Settings, get_settings
from shared.core.db import Database
from shared.core.db_retries import Backoff, is_transient
from shared.core.errors import GluejobsError, StaleClaim
from shared.core.storage import Store
from shared.core.tables import Job
from shared.data.local_copies import local_copy
from shared.jobs_repo import Claim
from shared.jobspec.capability import runnable_spec
from shared.jobspec.spec import JobSpec
from worker.fleet.db_reporter import QueuedReporter, exit_stale
from worker.fleet.liveness import watch_worker
from worker.fleet.outcome import PREEMPTED_EXIT, Failure, classify, discard_error_file, write_failure
from worker.training import checkpoints
from worker.training.job_storage import JobStorage

logger = logging.getLogger("worker.fleet.child")

T = TypeVar("T")


def parser() -> argparse.ArgumentParser:
    result = argparse.ArgumentParser(prog="python -m worker.fleet.child")
    result.add_argument("--job-id", type=int, required=True)
    result.add_argument("--worker-id", required=True, help="the claim: the worker that holds the job")
    result.add_argument("--attempt", type=int, required=True, help="the claim: the attempt this is")
    return result


class StopRequest:
    """Set by SIGTERM: training saves a checkpoint at the next step boundary and stops."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)
        # SIGINT stops at once (a cancel, a timeout): KeyboardInterrupt, whatever the parent left.
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def _handle(self, _signum: int, _frame: FrameType | None) -> None:
        if not self._event.is_set():
            logger.info("asked to stop: saving a checkpoint at the next step boundary")
        self._event.set()

    def __call__(self) -> bool:
        return self._event.is_set()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s %(levelname)s [job {args.job_id}] %(name)s: %(message)s"
    )
    watch_worker()  # first: an orphan must not even start
    stop = StopRequest()
    stop.install()
    claim = Claim(job_id=args.job_id, worker_id=args.worker_id, attempt=args.attempt)
    rank = int(os.environ.get("RANK", "0"))
    settings = get_settings()
    db = Database(settings.database_url)
    try:
        return run_attempt(claim, settings, db, rank=rank, stop_requested=stop)
    finally:
        db.dispose()


def run_attempt(
    claim: Claim, settings: Settings, db: Database, *, rank: int, stop_requested: Callable[[], bool]
) -> int:
    """One attempt, start to end; the process's exit status."""
    output_dir: Path | None = None
    reporter: QueuedReporter | None = None
    try:
        job = _until_reachable(lambda: _read_job(db, claim.job_id), settings)
        assert job.output_dir, "the runner sets output_dir before it starts the child"
        storage = JobStorage.of(settings, claim.job_id)
        output_dir = storage.local
        checkpoints_dir = storage.checkpoints_dir
        # As the worker read it before it ran the job (shared/jobspec/capability.py): fields this
        # build does not know and the job leaves off are dropped.
        spec = runnable_spec(job.spec)

        def stale(error: StaleClaim) -> None:
            # Nothing this attempt was still writing may stay behind for the current one to find.
            checkpoints.remove_staging(checkpoints_dir, attempt=claim.attempt)
            exit_stale(error)

        reporter = QueuedReporter(db, claim, on_stale=stale)
        if spec.noop:
            if rank == 0:
                reporter.result({"noop": True})
            reporter.close()
            return 0
        fetch_uploaded_files(spec, settings, storage.store)
        if rank == 0:
            reporter.environment(_environment(job, settings))
        resume_from = _resume_point(db, claim, settings, storage, reporter, rank=rank)
        # Imported here so that a broken torch install fails the job with its message, not the import.
        from worker.training.loop import Preempted, run_training

        try:
            result = run_training(
                spec,
                settings,
                output_dir=output_dir,
                reporter=reporter,
                resume_from=resume_from,
                stop_requested=stop_requested,
                storage=storage,
            )
        except Preempted as stopped:
            # The checkpoint by its name, as the job's checkpoints list it: its folder is this machine's
            # (an evaluation job stops with none).
            saved = stopped.checkpoint.name if stopped.checkpoint is not None else None
            if rank == 0:  # one event for the attempt, whatever the number of processes or machines
                reporter.log(str(stopped), data={"step": stopped.step, "checkpoint": saved})
            reporter.close()
            logger.info("%s", stopped)
            return PREEMPTED_EXIT
        discard_error_file(output_dir, rank)  # not among the outputs
        if rank == 0:
            storage.upload_outputs()  # in the store before the job may succeed
            reporter.result(result)
        reporter.close()  # every row written before the process says it succeeded
        if rank == 0:
            _tidy_checkpoints(db, claim, storage)
        return 0
    except BaseException as exc:  # the runner must learn why, whatever it was
        message = exc.message if isinstance(exc, GluejobsError) else f"{type(exc).__name__}: {exc}"
        code = classify(exc)
        logger.error("job %s failed [%s]: %s\n%s", claim.job_id, code, message, traceback.format_exc())
        if output_dir is not None:
            try:
                write_failure(output_dir, rank, Failure(code, message))
            except OSError as error:  # no reserved room, and none left: the worker reads the disk
                logger.error("could not write the error file: %s", error)
        if reporter is not None:
            # What was reported before the failure still counts (best effort: the failure itself
            # may be the database).
            reporter.close(timeout_s=settings.heartbeat_s)
        return 1


def _read_job(db: Database, job_id: int) -> Job:
    with db.session() as session:
        return jobs_repo.get_job(session, job_id=job_id)


def _declared_steps(db: Database, job_id: int) -> list[int]:
    with db.session() as session:
        return [c.step for c in jobs_repo.list_checkpoints(session, job_id=job_id)]


def _resume_point(
    db: Database,
    claim: Claim,
    settings: Settings,
    storage: JobStorage,
    reporter: QueuedReporter,
    *,
    rank: int,
) -> Path | None:
    """The newest checkpoint the database declared (worker/training/checkpoints.py: declared = durable =
    resumable), in this machine's folder (fetched from the store when it is elsewhere). The main
    process also removes the folders nobody declared and forgets declared checkpoints whose folder
    is gone; the other ranks only read (they resume from the same one)."""
    declared = _until_reachable(lambda: _declared_steps(db, claim.job_id), settings)
    if rank != 0 and int(os.environ.get("LOCAL_RANK", "0")) == 0:
        _fetch_for_this_machine(storage, declared)
    found = storage.reconcile(declared, remove=rank == 0)
    if rank == 0 and found.removed:
        reporter.log(
            f"removed checkpoint folder(s) that no attempt declared: {', '.join(found.removed)}",
            level="warning",
            data={"removed": found.removed},
        )
    if rank == 0 and found.forgotten:
        reporter.checkpoints_deleted(found.forgotten)
    return found.resume_from


def _fetch_for_this_machine(storage: JobStorage, declared: list[int]) -> None:
    """Another machine of a gang (issue 37) shares no disk with rank 0's: its first process fetches
    the checkpoint to resume from into this machine's folder, as rank 0's does on its own (the other
    processes here wait for that copy in `reconcile`). Only reads: what is stored is rank 0's."""
    if not storage.mirrored:
        return  # one folder for every machine (a shared disk): rank 0's copy is this one
    resumable = sorted(set(declared) & set(storage.stored_steps()))
    if resumable:
        storage.local_checkpoint(resumable[-1])


def _tidy_checkpoints(db: Database, claim: Claim, storage: JobStorage) -> None:
    """After a success: remove what an attempt that lost its lease may have left since this one
    started (a staging folder, or a checkpoint it published and could not declare). Best effort:
    the job has succeeded either way."""
    try:
        storage.reconcile(_declared_steps(db, claim.job_id))
    except Exception as exc:
        logger.warning("could not tidy the checkpoints folder: %s", str(exc).splitlines()[0][:200])


def _until_reachable(read: Callable[[], T], settings: Settings) -> T:
    """`read()`, retried while the database is away, for up to a lease (the worker hands the job
    back after that anyway)."""
    backoff = Backoff(base_s=0.1, cap_s=5.0)
    deadline = time.monotonic() + settings.lease_s
    while True:
        try:
            return read()
        except Exception as exc:
            if not is_transient(exc) or time.monotonic() > deadline:
                raise
            logger.warning("the database is unreachable; retrying: %s", str(exc).splitlines()[0][:200])
            time.sleep(backoff.next_delay())


def fetch_uploaded_files(spec: JobSpec, settings: Settings, store: Store) -> None:
    """This machine's checked copy of every uploaded file the spec names (shared/data/local_copies.py):
    fetched from the store when missing, fetched again when its bytes do not hash to the sha256
    the spec records."""
    for record in (spec.uploaded_files or {}).values():
        local_copy(store, settings.cache_dir, sha256=record.sha256, suffix=record.suffix)


def _environment(job: Job, settings: Settings) -> dict[str, Any]:
    from worker.fleet.reproducibility import environment_record

    return environment_record(job, settings)  # versions, device, data and weight hashes


if __name__ == "__main__":
    sys.exit(main())
