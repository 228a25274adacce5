"""One quota rule (shared/scheduling/quotas.py): the claim's SQL filters and the reason the API shows for a
held job never disagree. Owners with their own and with default limits on devices and device-hours,
some devices held, some hours spent; every queued job is admitted by the SQL exactly when the
explanation says nothing holds it, and `waiting_for` calls it a quota hold exactly when it is not."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, update

from shared import jobs_repo
from shared.core.db import Database, read
from shared.core.tables import Job, JobStatus, Owner, utcnow
from shared.scheduling.fair_share import ClaimPolicy
from shared.scheduling.quotas import (
    QuotaDefaults,
    claim_filters,
    device_hours_24h,
    devices_held,
    effective_quota,
    quota_hold,
)
from shared.scheduling.wait_reasons import waiting_for

SPEC = {"model_name_or_path": "tiny-bert", "task_name": "sst2", "seed": 1}
DEFAULTS = QuotaDefaults(max_devices=2, max_device_hours_per_day=5.0)
POLICY = ClaimPolicy(fair_share=True, quotas=DEFAULTS)
# name -> its own limits (None: the default), the devices its running jobs hold, hours it used today
OWNERS = {
    "alice": ({"max_devices": 3}, 2, 0.0),  # one device left of her own 3
    "bob": ({}, 1, 0.0),  # one left of the default 2
    "carol": ({"max_devices": 8, "max_device_hours_per_day": 1.5}, 0, 2.0),  # hours spent
    "dave": ({"max_device_hours_per_day": 3.0}, 0, 2.0),  # hours left, default devices
    "erin": ({}, 0, 0.0),  # no row of her own until she submits: the defaults
}


def _job(db: Database, owner: str, processes: int) -> int:
    with db.session() as session:
        return jobs_repo.create_job(session, spec={**SPEC, "num_processes": processes}, owner=owner).id


def _set_up(db: Database) -> list[int]:
    now = utcnow()
    for owner, (limits, held, hours) in OWNERS.items():
        if held:
            running = _job(db, owner, held)
            with db.session() as session, session.begin():
                session.execute(
                    update(Job)
                    .where(Job.id == running)
                    .values(
                        status=JobStatus.running, started_at=now, lease_expires_at=now + timedelta(hours=1)
                    )
                )
        if hours:  # a finished job of 2 devices that ran for hours / 2 within the last day
            done = _job(db, owner, 2)
            with db.session() as session, session.begin():
                session.execute(
                    update(Job)
                    .where(Job.id == done)
                    .values(
                        status=JobStatus.succeeded,
                        started_at=now - timedelta(hours=3),
                        finished_at=now - timedelta(hours=3) + timedelta(hours=hours / 2),
                    )
                )
        if limits:
            with db.session() as session, session.begin():
                session.merge(Owner(name=owner, share=1.0))
                session.execute(update(Owner).where(Owner.name == owner).values(**limits))
    return [_job(db, owner, processes) for owner in OWNERS for processes in (1, 2, 3)]


def test_the_claims_sql_and_the_waiting_reason_apply_one_rule(db: Database) -> None:
    queued = _set_up(db)
    now = utcnow()
    with db.session() as session, session.begin():
        held = devices_held(session)
        rows = {row.name: row for row in session.scalars(select(Owner))}
        filters = claim_filters(session, DEFAULTS, held=held, rows=rows, now=now)
        admitted = set(session.scalars(select(Job.id).where(Job.id.in_(queued), *filters.conditions)))
        hours = device_hours_24h(session, now=now)
        jobs = list(session.scalars(select(Job).where(Job.id.in_(queued))))
        explained = {
            job.id: quota_hold(
                job.owner,
                effective_quota(rows.get(job.owner), DEFAULTS),
                held=held.get(job.owner, 0),
                used_hours=hours.get(job.owner, 0.0),
                processes=job.num_processes,
            )
            for job in jobs
            if job.owner is not None
        }
    with db.session() as session:  # as the API calls it: the page read first, then its reasons
        with read(session):
            page = list(session.scalars(select(Job).where(Job.id.in_(queued))))
        shown = waiting_for(session, page, POLICY, now=now)
    assert filters.devices_limited
    assert {job_id for job_id, why in explained.items() if why is None} == admitted
    assert {job_id for job_id, why in shown.items() if why["reason"] == "quota"} == set(queued) - admitted
    by_owner = {job.id: (job.owner, job.num_processes) for job in jobs}
    assert sorted(by_owner[job_id] for job_id in admitted) == [
        ("alice", 1),
        ("bob", 1),
        ("dave", 1),
        ("dave", 2),
        ("erin", 1),
        ("erin", 2),
    ]
    assert explained[next(i for i, o in by_owner.items() if o == ("alice", 2))] == (
        "alice holds 2 of 3 devices (max_devices)"
    )
    assert "carol used 2.0 of 1.5 device-hours" in str(
        explained[next(i for i, o in by_owner.items() if o == ("carol", 1))]
    )
