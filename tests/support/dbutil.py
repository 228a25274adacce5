"""Reading the database directly in tests, to check what the code stored (or did not), and
claiming a job as a worker would, to write to it as its process does."""

from __future__ import annotations

from typing import Any

from alembic import command
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from shared import jobs_repo
from shared.core.db import Database
from shared.core.migrate import alembic_config
from shared.core.tables import Base, Job, JobStatus
from shared.jobs_repo import Claim


def downgrade(db: Database, revision: str) -> None:
    """The database as the previous release left it (its schema, without this release's tables)."""
    with db.engine.begin() as connection:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.downgrade(config, revision)


def count_rows(db: Database, model: type[Base]) -> int:
    with db.engine.connect() as connection:
        return int(connection.scalar(select(func.count()).select_from(model)) or 0)


def assert_refused(client: Any, db: Database, spec: dict[str, Any], field: str, message: str) -> None:
    """POST /v1/jobs with `spec` is refused (422) naming `field`, its message says `message`, and
    nothing is stored."""
    response = client.post("/v1/jobs", json={"spec": spec})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert (error["field"], message in error["message"]) == (field, True), error
    assert count_rows(db, Job) == 0


def claimed(
    session: Session, job_id: int | None = None, *, worker_id: str = "w", lease_s: float = 60
) -> Claim:
    """Claim the next queued job as worker `worker_id` (with `job_id`: it must be that one); the
    claim its process would carry. Every write a job's process makes is fenced by one."""
    job = jobs_repo.claim_next(session, worker_id=worker_id, lease_s=lease_s)
    assert job is not None, "no job to claim"
    assert job_id is None or job.id == job_id, f"claimed job {job.id}, not job {job_id}"
    return Claim(job.id, worker_id, job.attempts)


def finish_as_a_worker(
    db: Database,
    job_id: int,
    evaluations: dict[str, float],
    *,
    result: dict[str, Any] | None = None,
    checkpoint: str | None = None,
) -> None:
    """Claim `job_id`, write one evaluation at step 4 (and a checkpoint at `checkpoint`'s path), and
    finish it as succeeded: what a worker writes for a job, without training."""
    with db.session() as session:
        claim = claimed(session, job_id)
        rows = [
            jobs_repo.MetricRow(1.0, 4, "train", "loss", 0.5),
            *(jobs_repo.MetricRow(1.0, 4, "eval", name, value) for name, value in evaluations.items()),
        ]
        metric = next(iter(evaluations))
        jobs_repo.add_metrics(session, job_id=job_id, rows=rows, best_metric=metric, claim=claim)
        if checkpoint is not None:
            jobs_repo.add_checkpoint(
                session,
                job_id=job_id,
                step=4,
                epoch=1.0,
                path=checkpoint,
                metrics=evaluations,
                is_best=True,
                claim=claim,
            )
        if result is not None:
            jobs_repo.set_result(session, job_id=job_id, result=result, claim=claim)
        jobs_repo.finish_job(session, claim=claim, status=JobStatus.succeeded)
