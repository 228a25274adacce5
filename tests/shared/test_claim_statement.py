"""The claim in one statement (shared/jobs_repo/claim_statement.py, Postgres) picks what the stepwise
claim (queue._claim_stepwise, today's reference) picks, over random queues: owners with shares and
quotas, priorities (the admins' override among them), device asks, running jobs, retry backoffs,
reservations, jobs a build refused, gang jobs (several machines: their devices count every machine,
queued and running) and gangs still filling (which the statement hands to the stepwise claim, whose
workers may hold for them). SQLite takes the stepwise claim itself: the same comparison runs
there too, as a check of the harness."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import delete, insert, select

from shared import jobs_repo
from shared.core.db import Database
from shared.core.tables import (
    File,
    Job,
    JobEvent,
    JobGang,
    JobGangMember,
    JobStatus,
    Owner,
    OwnerStorageQuota,
    Worker,
    WorkerState,
    utcnow,
)
from shared.jobs_repo import claim_statement, queue
from shared.scheduling import quotas
from shared.scheduling.fair_share import ClaimPolicy
from shared.scheduling.quotas import QUOTA_FIELDS, QuotaDefaults
from tests.support import kit

CASES = {"postgresql": 40, "sqlite": 12}  # SQLite: a check of the harness (both are the stepwise claim)
CLAIMS = 3  # claims in a row per queue: each sees what the one before changed


@dataclass
class Case:
    owners: list[dict[str, Any]]
    storage: list[dict[str, Any]]  # owners' own storage quotas (the owner holds 100 bytes in a file)
    jobs: list[dict[str, Any]]
    policy: ClaimPolicy
    fit: dict[str, int]
    skip: list[int] = field(default_factory=list)
    gangs: list[dict[str, Any]] = field(default_factory=list)  # gangs still filling, rank 0 "other"


def _case(rng: random.Random) -> Case:
    now = utcnow()
    names = [f"o{i}" for i in range(rng.randint(1, 5))]
    owners = []
    storage = [
        {"owner": name, "max_storage_bytes": rng.choice([50, 10**9])} for name in names if rng.random() < 0.1
    ]
    for name in names:
        if rng.random() < 0.7:  # some owners have no row
            share = rng.choice([1.0, 1.0, 0.5, 2.0, 3.0, 0.0])
            devices = rng.randint(1, 4) if rng.random() < 0.1 else None
            hours = rng.choice([0.0, 100.0]) if rng.random() < 0.05 else None
            owners.append(
                {"name": name, "share": share, "max_devices": devices, "max_device_hours_per_day": hours}
            )
    jobs = []
    running = rng.choice([0.0, 0.2, 0.4, 0.6])  # some queues have every owner holding devices
    for index in range(1, rng.randint(2, 25)):
        status = (
            JobStatus.running
            if rng.random() < running
            else rng.choice([JobStatus.queued] * 5 + [JobStatus.succeeded])
        )
        created = now - timedelta(seconds=rng.choice([5, 30, 600, 3600]))
        machines = rng.choice([None] * 3 + [2, 3])  # a gang job now and then: N × D devices
        job: dict[str, Any] = {
            "id": index,
            "spec": {**kit.SPEC, "num_machines": machines} if machines else kit.SPEC,
            "priority": rng.choice([0, 0, 1, 2, 5, 1001]),
            "metadata": {},
            "owner": rng.choice([*names, None]),
            "status": status,
            "num_processes": rng.choice([1, 1, 1, 2, 3, 4]),
            "latest_metrics": {},
            "attempts": 0 if status == JobStatus.queued else 1,
            "created_at": created,
            "updated_at": created,
            "started_at": None if status == JobStatus.queued else created,
            "worker_id": None if status == JobStatus.queued else "busy",
            "not_before": None,
            "reserved_by": None,
            "reserved_at": None,
        }
        if status == JobStatus.queued and rng.random() < 0.15:
            job["not_before"] = now + timedelta(seconds=rng.choice([-10, 300]))
        if status == JobStatus.queued and rng.random() < 0.25:
            job["reserved_by"] = rng.choice(["me", "other", "gone"])
            job["reserved_at"] = now
        jobs.append(job)
    max_processes = rng.choice([None, 1, 2, 4])
    fit: dict[str, int] = {}
    if max_processes is not None:
        fit["max_processes"] = max_processes
        if rng.random() < 0.7:
            fit["capacity"] = max_processes + rng.choice([0, 0, 1, 3])
    policy = ClaimPolicy(
        fair_share=rng.random() < 0.7,
        max_user_priority=1000,
        reservation_after_s=rng.choice([None, 60.0, 60.0]),
        quotas=QuotaDefaults(max_devices=4 if rng.random() < 0.05 else None),
    )
    skip = [job["id"] for job in jobs if rng.random() < 0.05]
    gangs = []
    for job in jobs:  # a running gang job whose gang is still filling, opened by the live worker "other"
        if job["status"] == JobStatus.running and job["spec"] is not kit.SPEC and rng.random() < 0.2:
            job["worker_id"] = "other"
            gangs.append({"job_id": job["id"], "attempt": 1, "token": f"t{job['id']}", "size": 3})
    return Case(owners, storage, jobs, policy, fit, skip, gangs)


def _build(db: Database, case: Case) -> None:
    """The case's queue, from scratch (ids as given: both claims see the same rows)."""
    now = utcnow()
    with db.engine.begin() as connection:
        for table in (JobGangMember, JobGang, JobEvent, Job, Owner, Worker, OwnerStorageQuota, File):
            connection.execute(delete(table))
        if case.owners:
            connection.execute(insert(Owner), case.owners)
        if case.storage:
            connection.execute(insert(OwnerStorageQuota), case.storage)
            connection.execute(
                insert(File),
                [
                    {
                        "owner": quota["owner"],
                        "filename": "train.csv",
                        "format": "csv",
                        "purpose": "train",
                        "bytes": 100,
                        "sha256": "0" * 64,
                        "rows": 1,
                        "columns": [],
                        "checks": {},
                        "created_at": now,
                    }
                    for quota in case.storage
                ],
            )
        connection.execute(insert(Job.__table__), case.jobs)
        for gang in case.gangs:
            gang_id = connection.execute(
                insert(JobGang)
                .values(**gang, address="127.0.0.2", port=1, opened_at=now)
                .returning(JobGang.id)
            ).scalar_one()
            connection.execute(
                insert(JobGangMember).values(
                    gang_id=gang_id, rank=0, worker_id="other", joined_at=now, heartbeat_at=now
                )
            )
        workers = (("me", now), ("other", now), ("gone", now - timedelta(hours=1)))
        connection.execute(
            insert(Worker),
            [
                {
                    "id": worker,
                    "host": "h",
                    "pid": 1,
                    # "me" has the devices its claims say it has in all (a gang's holders need them).
                    "devices": [str(d) for d in range(case.fit.get("capacity", 1))]
                    if worker == "me"
                    else ["0"],
                    "state": WorkerState.busy,
                    "started_at": now,
                    "last_heartbeat_at": seen,
                }
                for worker, seen in workers
            ],
        )


def _claims(db: Database, case: Case, claim: Any) -> list[Any]:
    """CLAIMS claims in a row by worker "me": what each took, then the rows and events they wrote."""
    taken: list[Any] = []
    with db.session() as session:
        for _ in range(CLAIMS):
            job = claim(session, worker_id="me", lease_s=60, policy=case.policy, skip=case.skip, **case.fit)
            taken.append(None if job is None else (job.id, job.status, job.attempts, job.worker_id))
    with db.engine.connect() as connection:
        jobs = connection.execute(
            select(Job.id, Job.status, Job.worker_id, Job.attempts, Job.reserved_by, Job.not_before)
            .where(Job.status != JobStatus.queued)
            .order_by(Job.id)
        ).all()
        events = connection.execute(
            select(
                JobEvent.job_id, JobEvent.kind, JobEvent.message, JobEvent.data, JobEvent.attempt
            ).order_by(JobEvent.id)
        ).all()
    return [*taken, [tuple(row) for row in jobs], [tuple(row) for row in events]]


def test_the_one_statement_claims_what_the_stepwise_claim_claims(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    answered = []
    one_statement = claim_statement.claim_in_one_statement

    def counted(*args: Any, **kwargs: Any) -> Any:
        outcome = one_statement(*args, **kwargs)
        answered.append(outcome is not claim_statement.STEPWISE)
        return outcome

    monkeypatch.setattr(queue, "claim_in_one_statement", counted)
    # The stepwise claim reuses its list of owners over their storage quota for a few seconds;
    # each case's queue is new, so each claim reads it afresh.
    monkeypatch.setattr(quotas, "OVER_STORAGE_CACHE_S", 0.0)
    rng = random.Random(37)
    claimed = 0
    for number in range(CASES[db.dialect]):
        case = _case(rng)
        _build(db, case)
        before = _claims(db, case, queue._claim_stepwise)
        _build(db, case)
        after = _claims(db, case, jobs_repo.claim_next)
        assert after == before, f"case {number}"
        claimed += sum(1 for taken in before[:CLAIMS] if taken is not None)
    assert claimed > CASES[db.dialect]  # the queues were not all empty
    if db.dialect == "postgresql":
        # Most claims were the one statement's own, not handed to the stepwise claim.
        assert sum(answered) > 0.6 * len(answered), (sum(answered), len(answered))
    else:
        assert answered == []


def test_the_one_statement_knows_every_quota_the_claim_honours() -> None:
    """A quota added to the claim (shared/scheduling/quotas.py) must be one the statement hands to the
    stepwise claim, or it would claim past it: max_queued alone is not the claim's."""
    assert set(QUOTA_FIELDS) - {"max_queued"} <= set(claim_statement._DEFAULT_LIMITS)
