"""The writes behind an owner's storage (issue 33 item 5): the tally's sizes, the removal of a finished
job's checkpoints (DELETE /v1/jobs/{id}/checkpoints, and the retention, GLUEJOBS_CHECKPOINT_RETENTION_DAYS)
and the journal that makes that removal crash-safe. The reads are shared/scheduling/storage_usage.py.

Sizes (rows of checkpoint_sizes and job_output_sizes). A checkpoint is sized once it is declared
(its folder is whole in the store then, and never changes), a job's other files once it has finished
(and settled: its last log copy lands just after its status): one listing of the store each, by the
API's storage sweep (`size_new`), never per request. A checkpoint of a worker of an older build is
sized the same way.

Removal, rows first. In one transaction the checkpoint rows go and a store_deletions row names each
folder; then the folders are removed and their journal rows with them (`finish_deletions`). A crash
before the commit changes nothing; one after it leaves journal rows, which the next sweep (every
GLUEJOBS_STORAGE_SWEEP_S in each API process, and at its start) finishes. So no row ever names a
missing object (the rows went first: a reader sees the checkpoint whole, or not at all), and no
object without a row stays past the sweep. The reverse order (objects, then rows) leaves rows naming
missing folders when it is cut in between, which the existing sweeps could not tell from a folder
lost by accident; and the listing sweeps of files/ and models/ (service/files/stored_files.py,
shared/jobs_repo/model_objects.py) would have to list every job's folder to find what the journal
names. A job that starts from one of these checkpoints (`job:N/checkpoint-M`) has its own copy, pinned
when it was submitted (shared/jobspec/job_sources.py), so removing the source is safe.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import PurePosixPath

from sqlalchemy import ColumnElement, delete, func, or_, select
from sqlalchemy.orm import Session, aliased

from shared.core.db import read, write
from shared.core.errors import Conflict, InvalidRequest, quote
from shared.core.ownership import _owned
from shared.core.storage import Store
from shared.core.tables import (
    TERMINAL_STATUSES,
    Checkpoint,
    CheckpointSize,
    Job,
    JobOutputSize,
    JobStatus,
    StoreDeletion,
    utcnow,
)
from shared.jobs_repo.events import CHECKPOINT, _event, _insert_for
from shared.wire.job_folder import (
    CHECKPOINT_PREFIX,
    CHECKPOINTS,
    MAX_STEP_DIGITS,
    checkpoint_key,
    checkpoint_name,
    job_key,
)

logger = logging.getLogger(__name__)

# A finished job's files are sized this long after it finished: its last log copy comes just after.
SETTLE_S = 60.0
# What one pass of the sweep sizes or removes at most (the next pass goes on).
BATCH = 200


@dataclass(frozen=True)
class Pruned:
    """What a removal did: the checkpoints removed and kept (by name), and the bytes freed (as sized;
    a checkpoint not sized yet counts nothing)."""

    job_id: int
    removed: list[str]
    kept: list[str]
    freed_bytes: int
    journal: list[int] = field(default_factory=list, repr=False)  # store_deletions rows to finish


# --- removing checkpoints ----------------------------------------------------------------------------


def _parse_keep(keep: Sequence[str]) -> set[int]:
    steps, bad = set(), []
    for name in keep:
        step = name.strip().removeprefix(CHECKPOINT_PREFIX)
        if name.strip().startswith(CHECKPOINT_PREFIX) and step.isdigit() and len(step) <= MAX_STEP_DIGITS:
            steps.add(int(step))
        else:
            bad.append(name)
    if bad:
        raise InvalidRequest(
            "keep names checkpoints as checkpoint-STEP (checkpoint-300); not "
            + ", ".join(map(quote, bad[:5])),
            field="keep",
        )
    return steps


def default_keep(job: Job, rows: Sequence[Checkpoint]) -> set[int]:
    """What a removal keeps when the caller names nothing: the best checkpoint (by the job's ranking
    metric) and, for a job that did not succeed (no final model), its newest one: the run's last state.
    A succeeded job's final model is in its folder, never a checkpoint: it always stays."""
    kept = {row.step for row in rows if row.is_best}
    if job.status != JobStatus.succeeded and rows:
        kept.add(max(row.step for row in rows))
    return kept


def _remove_rows(session: Session, job: Job, rows: Sequence[Checkpoint], keep: set[int], why: str) -> Pruned:
    """Inside the caller's write transaction (`job` locked): the rows not in `keep` go, a journal row
    names each folder, and the job's events say so."""
    doomed = [row for row in rows if row.step not in keep]
    kept = [checkpoint_name(row.step) for row in rows if row.step in keep]
    if not doomed:
        return Pruned(job.id, [], kept, 0)
    steps = sorted(row.step for row in doomed)
    freed = _sized(session, [row.id for row in doomed])
    session.execute(delete(Checkpoint).where(Checkpoint.job_id == job.id, Checkpoint.step.in_(steps)))
    now = utcnow()
    journal = [
        StoreDeletion(key=checkpoint_key(job.id, step), job_id=job.id, created_at=now) for step in steps
    ]
    session.add_all(journal)
    session.flush()
    _event(
        session,
        job.id,
        CHECKPOINT,
        f"removed checkpoint(s) at step {', '.join(map(str, steps))} ({why})",
        data={"deleted_steps": steps, "freed_bytes": freed},
        locked=True,
    )
    return Pruned(job.id, [checkpoint_name(s) for s in steps], kept, freed, [row.id for row in journal])


def _sized(session: Session, checkpoint_ids: list[int]) -> int:
    total = session.scalar(
        select(func.coalesce(func.sum(CheckpointSize.bytes), 0)).where(
            CheckpointSize.checkpoint_id.in_(checkpoint_ids)
        )
    )
    return int(total or 0)


def remove_checkpoints(
    session: Session, *, job_id: int, owner: str | None, keep: Sequence[str] | None, actor: str | None
) -> Pruned:
    """Remove the checkpoint rows of a finished job (through the one ownership check: another owner's
    job is a 404) but those in `keep` (names, "checkpoint-300"; None: `default_keep`). Conflict (409)
    while the job is queued or running; InvalidRequest (422) for a name it has no checkpoint of. The
    folders are journalled: the caller removes them next (`finish_deletions`)."""
    with write(session):
        job = _owned(session, Job, job_id, owner, lock=True)
        if job.status not in TERMINAL_STATUSES:
            raise Conflict(
                f"job {job_id} is {job.status}: its checkpoints can be removed once it has finished "
                "(cancel it first to stop it)"
            )
        rows = list(
            session.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step))
        )
        if keep is None:
            kept = default_keep(job, rows)
        else:
            kept = _parse_keep(keep)
            missing = sorted(kept - {row.step for row in rows})
            if missing:
                have = ", ".join(checkpoint_name(row.step) for row in rows[-10:]) or "none"
                raise InvalidRequest(
                    f"job {job_id} has no {', '.join(checkpoint_name(s) for s in missing)}; "
                    f"its checkpoints: {have}",
                    field="keep",
                )
        return _remove_rows(
            session, job, rows, kept, f"removed by {actor}" if actor else "removed on request"
        )


def finish_deletions(
    session: Session, store: Store, ids: Iterable[int] | None = None, *, limit: int = BATCH
) -> int:
    """Remove the store folders the journal names (those of `ids`, or the oldest `limit` of them), each
    journal row once its folder is gone; how many. A store that is away leaves the rest to the next
    sweep (StoreUnavailable goes to the caller)."""
    with read(session):
        query = select(StoreDeletion.id, StoreDeletion.key).order_by(StoreDeletion.id).limit(limit)
        if ids is not None:
            query = query.where(StoreDeletion.id.in_(list(ids)))
        pending = session.execute(query).all()
    done = 0
    for row_id, key in pending:
        store.delete(key)
        with write(session):
            session.execute(delete(StoreDeletion).where(StoreDeletion.id == row_id))
        done += 1
    return done


# --- retention ---------------------------------------------------------------------------------------


def _removable() -> ColumnElement[bool]:
    """A job has a checkpoint the default keep would remove: one not the best, and (for a job that did
    not succeed) not its newest. The retention's query asks only for those, so jobs with nothing to
    remove never fill its batches."""
    later = aliased(Checkpoint)
    return (
        select(Checkpoint.id)
        .where(
            Checkpoint.job_id == Job.id,
            Checkpoint.is_best.is_(False),
            or_(
                Job.status == JobStatus.succeeded,
                select(later.id).where(later.job_id == Job.id, later.step > Checkpoint.step).exists(),
            ),
        )
        .exists()
    )


def apply_retention(
    session: Session, *, days: float, now: datetime | None = None, limit: int = 50
) -> list[Pruned]:
    """Finished jobs that finished more than `days` ago lose their checkpoints but the default keep
    (best, and a job without a final model its newest): the same removal as the route's, journalled."""
    now = now or utcnow()
    cutoff = now - timedelta(days=days)
    with read(session):
        due = list(
            session.scalars(
                select(Job.id)
                .where(
                    Job.status.in_(TERMINAL_STATUSES),
                    Job.finished_at.is_not(None),
                    Job.finished_at < cutoff,
                    _removable(),
                )
                .order_by(Job.id)
                .limit(limit)
            )
        )
    done = []
    for job_id in due:
        with write(session):
            job = session.get(Job, job_id, with_for_update=True)
            if job is None or job.status not in TERMINAL_STATUSES:
                continue
            rows = list(
                session.scalars(
                    select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step)
                )
            )
            pruned = _remove_rows(session, job, rows, default_keep(job, rows), f"kept {days:g} days")
        if pruned.removed:
            done.append(pruned)
    return done


# --- sizes -------------------------------------------------------------------------------------------


def size_new(session: Session, store: Store, *, now: datetime | None = None, limit: int = BATCH) -> int:
    """Size what has no size yet: declared checkpoints, and finished jobs' other files once settled
    (one listing of the store each); how many rows were sized."""
    now = now or utcnow()
    with read(session):
        checkpoints = session.execute(
            select(Checkpoint.id, Checkpoint.job_id, Checkpoint.step, Job.owner)
            .join(Job, Job.id == Checkpoint.job_id)
            .outerjoin(CheckpointSize, CheckpointSize.checkpoint_id == Checkpoint.id)
            .where(CheckpointSize.checkpoint_id.is_(None))
            .order_by(Checkpoint.id)
            .limit(limit)
        ).all()
        jobs = session.execute(
            select(Job.id, Job.owner)
            .outerjoin(JobOutputSize, JobOutputSize.job_id == Job.id)
            .where(
                JobOutputSize.job_id.is_(None),
                Job.status.in_(TERMINAL_STATUSES),
                Job.finished_at < now - timedelta(seconds=SETTLE_S),
            )
            .order_by(Job.id)
            .limit(limit)
        ).all()
    sized = 0
    for row_id, job_id, step, owner in checkpoints:
        total = sum(item.size for item in store.list(checkpoint_key(job_id, step)))
        with write(session):
            # Gone meanwhile (rotated, removed): nothing to size; sized meanwhile (another API): kept.
            if session.get(Checkpoint, row_id) is not None:
                row = {"checkpoint_id": row_id, "bytes": total, "owner": owner}
                _insert_ignore(session, CheckpointSize, row)
        sized += 1
    for job_id, owner in jobs:
        files = store.list(job_key(job_id))
        total = sum(item.size for item in files if PurePosixPath(item.path).parts[0] != CHECKPOINTS)
        with write(session):
            if session.get(Job, job_id) is not None:
                _insert_ignore(session, JobOutputSize, {"job_id": job_id, "bytes": total, "owner": owner})
        sized += 1
    return sized


def _insert_ignore(
    session: Session, table: type[CheckpointSize] | type[JobOutputSize], row: dict[str, int | str | None]
) -> None:
    key = "checkpoint_id" if table is CheckpointSize else "job_id"
    session.execute(_insert_for(session)(table).values(row).on_conflict_do_nothing(index_elements=[key]))


def sweep_storage(
    session: Session, store: Store, *, retention_days: float | None, now: datetime | None = None
) -> dict[str, int]:
    """One pass of the API's storage sweep: journalled removals finished, the retention applied (its
    removals finished at once), new checkpoints and finished jobs sized. What each part did."""
    done = {"finished": finish_deletions(session, store), "retained": 0, "sized": 0}
    if retention_days is not None:
        pruned = apply_retention(session, days=retention_days, now=now)
        for one in pruned:
            finish_deletions(session, store, one.journal)
        done["retained"] = len(pruned)
    done["sized"] = size_new(session, store, now=now)
    return done
