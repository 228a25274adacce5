"""Workers: registration, liveness, and the view GET /v1/workers gives."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, inspect, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from shared.core.db import read, write
from shared.core.tables import ACTIVE_STATUSES, Job, Worker, WorkerBuild, WorkerState, utcnow

# A worker that has not heartbeated for this long is gone from GET /v1/workers (and its row deleted).
WORKER_RETENTION_S = 24 * 3600.0


def register_worker(
    session: Session,
    *,
    worker_id: str,
    host: str,
    pid: int,
    devices: Sequence[str] = (),
    version: str | None = None,
    build: dict[str, Any] | None = None,
) -> None:
    """The worker's row; with `build` (shared/core/build.py build_record), its build's row too, once
    per build: what GET /v1/workers says the worker supports."""
    now = utcnow()
    with write(session):
        if build is not None and _has_builds_table(session):
            _insert_ignore(session, {**build, "first_seen_at": now})
        session.merge(
            Worker(
                id=worker_id,
                host=host,
                pid=pid,
                devices=list(devices),
                version=version,
                state=WorkerState.idle,
                started_at=now,
                last_heartbeat_at=now,
            )
        )


def _has_builds_table(session: Session) -> bool:
    # A schema before 0014 (a fleet mid-upgrade: the previous schema under this build): no row.
    return inspect(session.connection()).has_table(WorkerBuild.__tablename__)


def _insert_ignore(session: Session, row: dict[str, Any]) -> None:
    """The build's row unless it is there (the same build's workers all write the same row)."""
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    session.execute(insert(WorkerBuild).values(row).on_conflict_do_nothing(index_elements=["build"]))


def touch_worker(session: Session, *, worker_id: str, state: WorkerState | None = None) -> None:
    """The worker is alive (and, with `state`, idle, busy, low_disk or draining)."""
    values: dict[str, Any] = {"last_heartbeat_at": utcnow()}
    if state is not None:
        values["state"] = state
    with write(session):
        session.execute(update(Worker).where(Worker.id == worker_id).values(**values))


def worker_stopped(session: Session, *, worker_id: str) -> None:
    with write(session):
        session.execute(
            update(Worker).where(Worker.id == worker_id).values(stopped_at=utcnow(), state="stopped")
        )


def prune_workers(session: Session, *, now: datetime | None = None) -> int:
    """Delete workers not heard from for WORKER_RETENTION_S; how many. A read first: usually there
    are none, and then no write lock is taken."""
    cutoff = (now or utcnow()) - timedelta(seconds=WORKER_RETENTION_S)
    with read(session):
        if (
            session.scalars(select(Worker.id).where(Worker.last_heartbeat_at < cutoff).limit(1)).first()
            is None
        ):
            return 0
    with write(session):
        deleted = session.execute(
            delete(Worker).where(Worker.last_heartbeat_at < cutoff).returning(Worker.id)
        ).all()
    return len(deleted)


def _builds(session: Session, versions: set[str | None]) -> dict[str, dict[str, Any]]:
    """The builds the workers' versions name ("0.2.0+<build>"), by version."""
    wanted = {v.partition("+")[2]: v for v in versions if v and "+" in v}
    if not wanted:
        return {}
    rows = session.scalars(select(WorkerBuild).where(WorkerBuild.build.in_(list(wanted))))
    return {
        wanted[row.build]: {
            "version": row.version,
            "build": row.build,
            "commit": row.commit,
            "schema_head": row.schema_head,
            "spec_fields": list(row.spec_fields or []),
        }
        for row in rows
    }


@dataclass(frozen=True)
class WorkerView:
    """A worker as GET /v1/workers shows it: state "gone" when it stopped heartbeating for a lease
    without saying goodbye (derived, never stored); its current jobs."""

    id: str
    host: str
    pid: int
    version: str | None
    devices: list[str]
    state: str
    started_at: datetime
    last_heartbeat_at: datetime
    stopped_at: datetime | None
    jobs: list[dict[str, Any]]
    # Its build (release, build hash, commit, schema head, supported spec fields), or None for a
    # worker of a build before builds were recorded.
    build: dict[str, Any] | None = None


def list_workers(
    session: Session, *, lease_s: float, owner: str | None = None, now: datetime | None = None
) -> list[WorkerView]:
    """Workers heard from within WORKER_RETENTION_S, newest first, each with the jobs it holds
    (with `owner`, only that owner's jobs: the workers are shared, the jobs are not)."""
    now = now or utcnow()
    cutoff = now - timedelta(seconds=WORKER_RETENTION_S)
    with read(session):
        workers = list(
            session.scalars(
                select(Worker).where(Worker.last_heartbeat_at >= cutoff).order_by(Worker.started_at.desc())
            )
        )
        query = (
            select(Job.worker_id, Job.id, Job.attempts, Job.status, Job.devices)
            .where(Job.worker_id.in_([w.id for w in workers]), Job.status.in_(ACTIVE_STATUSES))
            .order_by(Job.id)
        )
        if owner is not None:
            query = query.where(Job.owner == owner)
        held = session.execute(query).all()
        builds = _builds(session, {w.version for w in workers})
    jobs: dict[str, list[dict[str, Any]]] = {}
    for worker_id, job_id, attempt, status, devices in held:
        jobs.setdefault(worker_id or "", []).append(
            {"id": job_id, "attempt": attempt, "status": status, "devices": devices}
        )
    views = []
    for w in workers:
        state = w.state
        if state != WorkerState.stopped and w.last_heartbeat_at < now - timedelta(seconds=lease_s):
            state = "gone"
        views.append(
            WorkerView(
                id=w.id,
                host=w.host,
                pid=w.pid,
                version=w.version,
                devices=list(w.devices or []),
                state=state,
                started_at=w.started_at,
                last_heartbeat_at=w.last_heartbeat_at,
                stopped_at=w.stopped_at,
                jobs=jobs.get(w.id, []),
                build=builds.get(w.version or ""),
            )
        )
    return views
