"""What a running job's process reports: metric rows, checkpoints, log events, its environment and
its result. Every write is fenced by the attempt's claim; those a crash can make the job repeat are
idempotent."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, update
from sqlalchemy.orm import Session

from shared.core.artifact_links import download_command
from shared.core.db import write
from shared.core.tables import Checkpoint, Job, JobMetric, utcnow
from shared.jobs_repo.claims import Claim, _fence
from shared.jobs_repo.events import CHECKPOINT, LOG, _event, _insert_for
from shared.jobs_repo.streams import notify_rows
from shared.jobspec.tasks import EVAL_SPLIT, greater_is_better
from shared.webhooks.events import checkpoint_declared


@dataclass(frozen=True)
class MetricRow:
    epoch: float
    step: int
    split: str
    name: str
    value: float


def add_metrics(
    session: Session,
    *,
    job_id: int,
    rows: Iterable[MetricRow],
    best_metric: str | None = None,
    claim: Claim,
) -> int:
    """Insert metric rows, skipping any (split, name, step) the job already has; the count inserted.

    The job's latest metrics (per split) and best evaluation are updated in the same transaction.
    The write is refused (StaleClaim) unless `claim` is the job's current claim; the rows record its
    attempt. Repeating the same call (a retry after a lost acknowledgement) adds nothing.
    """
    rows = list(rows)
    if not rows:
        return 0
    now = utcnow()
    values = [
        {
            "job_id": job_id,
            "epoch": r.epoch,
            "step": r.step,
            "split": r.split,
            "name": r.name,
            "value": r.value,
            "created_at": now,
            "attempt": claim.attempt,
        }
        for r in rows
    ]
    with write(session):
        # The job's row lock first (and the fence): the same order as every other write of the job.
        job = _fence(session, claim, job_id=job_id)
        insert = _insert_for(session)(JobMetric).values(values)
        insert = insert.on_conflict_do_nothing(index_elements=["job_id", "split", "name", "step"])
        inserted = session.execute(insert.returning(JobMetric.id)).all()
        if inserted:
            notify_rows(session, job_id)  # the live streams hear of them once this commits
        latest = dict(job.latest_metrics or {})
        for r in rows:
            split = dict(latest.get(r.split, {}))
            if r.step >= split.get("step", -1):
                split.update({r.name: r.value, "step": r.step, "epoch": r.epoch})
            latest[r.split] = split
        job.latest_metrics = latest
        if best_metric is not None:
            _update_best(job, rows, best_metric)
    return len(inserted)


def _update_best(job: Job, rows: list[MetricRow], metric: str) -> None:
    evals = {r.name: r.value for r in rows if r.split == EVAL_SPLIT}
    if metric not in evals:
        return
    value = evals[metric]
    best = job.best_metrics
    better = greater_is_better(metric, job.spec.get("greater_is_better"))
    if best is None or (value > best["value"] if better else value < best["value"]):
        step = next(r.step for r in rows if r.split == EVAL_SPLIT)
        epoch = next(r.epoch for r in rows if r.split == EVAL_SPLIT)
        job.best_metrics = {"metric": metric, "value": value, "step": step, "epoch": epoch, "metrics": evals}


def add_checkpoint(
    session: Session,
    *,
    job_id: int,
    step: int,
    epoch: float,
    path: str,
    metrics: dict[str, float],
    is_best: bool = False,
    claim: Claim,
    dedup_key: str | None = None,
) -> None:
    with write(session):
        _fence(session, claim, job_id=job_id)
        if is_best:
            session.execute(update(Checkpoint).where(Checkpoint.job_id == job_id).values(is_best=False))
        insert = _insert_for(session)(Checkpoint).values(
            job_id=job_id,
            step=step,
            epoch=epoch,
            path=path,
            metrics=metrics,
            is_best=is_best,
            created_at=utcnow(),
        )
        session.execute(
            insert.on_conflict_do_update(
                index_elements=["job_id", "step"],
                set_={"path": path, "metrics": metrics, "is_best": is_best, "epoch": epoch},
            )
        )
        # Also an event, so the live stream and the event cursor carry checkpoints in order.
        _event(
            session,
            job_id,
            CHECKPOINT,
            f"checkpoint at step {step}" + (" (best so far)" if is_best else ""),
            # What a reader can use, not the worker's folder or the store's URI (the checkpoint row
            # keeps those, for operators).
            data={
                "step": step,
                "epoch": epoch,
                "download": download_command(job_id, checkpoint=step),
                "metrics": metrics,
                "is_best": is_best,
            },
            attempt=claim.attempt,
            dedup_key=dedup_key,
        )
        checkpoint_declared(session, job_id=job_id, step=step, epoch=epoch, metrics=metrics, is_best=is_best)


def delete_checkpoints(
    session: Session,
    *,
    job_id: int,
    steps: Sequence[int],
    claim: Claim,
    dedup_key: str | None = None,
) -> None:
    """Forget checkpoints whose folders were removed (save_total_limit)."""
    if not steps:
        return
    with write(session):
        _fence(session, claim, job_id=job_id)
        session.execute(delete(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.step.in_(steps)))
        _event(
            session,
            job_id,
            CHECKPOINT,
            f"removed checkpoint(s) at step {', '.join(map(str, steps))}",
            data={"deleted_steps": list(steps)},
            attempt=claim.attempt,
            dedup_key=dedup_key,
        )


def add_event(
    session: Session,
    *,
    job_id: int,
    message: str,
    level: str = "info",
    data: dict[str, Any] | None = None,
    claim: Claim,
    dedup_key: str | None = None,
) -> None:
    """A log event. With `dedup_key`, repeating the call (a retry after a lost acknowledgement)
    adds nothing."""
    with write(session):
        _fence(session, claim, job_id=job_id)
        _event(
            session,
            job_id,
            LOG,
            message,
            level=level,
            data=data,
            attempt=claim.attempt,
            dedup_key=dedup_key,
        )


def set_environment(session: Session, *, job_id: int, environment: dict[str, Any], claim: Claim) -> None:
    """What the running attempt runs with (versions, device, data and weight hashes, the spec)."""
    with write(session):
        _fence(session, claim, job_id=job_id).environment = environment


def set_result(session: Session, *, job_id: int, result: dict[str, Any], claim: Claim) -> None:
    with write(session):
        job = _fence(session, claim, job_id=job_id)
        job.result = {**(job.result or {}), **result}
