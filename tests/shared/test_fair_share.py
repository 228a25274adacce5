"""The claim's order on both databases, without worker processes: fair share between owners, the
admins' priority override, device and device-hours quotas, reservations for wide jobs."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from shared import jobs_repo
from shared.core.db import Database
from shared.core.tables import Job, JobStatus, Owner, utcnow
from shared.scheduling.fair_share import ClaimPolicy
from shared.scheduling.quotas import QuotaDefaults
from shared.scheduling.wait_reasons import waiting_for
from tests.support import kit

SPEC = {**kit.SPEC, "seed": 1}
FAIR = ClaimPolicy(fair_share=True, max_user_priority=100)


def _queue(
    db: Database, owner: str | None, count: int = 1, *, priority: int = 0, processes: int = 1
) -> list[int]:
    spec = {**SPEC, "num_processes": processes}
    with db.session() as session:
        return [
            jobs_repo.create_job(session, spec=spec, owner=owner, priority=priority).id for _ in range(count)
        ]


def _claim(db: Database, policy: ClaimPolicy = FAIR, worker: str = "w", **fit: int) -> Job | None:
    with db.session() as session:
        return jobs_repo.claim_next(session, worker_id=worker, lease_s=60, policy=policy, **fit)


def _owners_of(db: Database, claims: int, policy: ClaimPolicy = FAIR) -> list[str | None]:
    owners = []
    for _ in range(claims):
        job = _claim(db, policy)
        assert job is not None
        owners.append(job.owner)
    return owners


def _set_owner(db: Database, name: str, **values: object) -> None:
    with db.session() as session, session.begin():
        session.merge(Owner(name=name, share=1.0))
        session.execute(update(Owner).where(Owner.name == name).values(**values))


def test_fair_share_alternates_owners_and_off_is_priority_then_age(db: Database) -> None:
    a_jobs = _queue(db, "alice", 4)
    _queue(db, "bob", 2)
    # alice holds none at first and goes first (oldest); then bob holds fewer, and so on.
    assert _owners_of(db, 4) == ["alice", "bob", "alice", "bob"]
    _queue(db, "bob", 2)
    off = ClaimPolicy(fair_share=False)
    assert _claim(db, off).id == a_jobs[2]  # type: ignore[union-attr]  # oldest first, whoever holds what


def test_share_weights_and_priority_orders_one_owners_jobs(db: Database) -> None:
    _set_owner(db, "alice", share=2.0)
    _queue(db, "alice", 3)
    _queue(db, "bob", 3)
    # alice's share 2: she may hold two devices for bob's one before bob goes first.
    assert _owners_of(db, 3) == ["alice", "bob", "alice"]
    urgent = _queue(db, "alice", priority=50)[0]
    _queue(db, "carol", 1)
    assert _claim(db).owner == "carol"  # type: ignore[union-attr]  # holds 0: fair share before priority
    assert _claim(db).id == urgent  # type: ignore[union-attr]  # 2/2 = bob's 1/1; priority decides


def test_a_priority_above_the_users_range_overrides_fair_share(db: Database) -> None:
    _queue(db, "bob", 2)
    assert _claim(db).owner == "bob"  # type: ignore[union-attr]
    admin_job = _queue(db, "bob", priority=500)[0]
    _queue(db, "alice", 1)
    assert _claim(db).id == admin_job  # type: ignore[union-attr]  # bob holds 1, alice 0: still bob


def test_max_devices_skips_the_owner_at_its_limit(db: Database) -> None:
    _set_owner(db, "alice", max_devices=1)
    _queue(db, "alice", 3)
    _queue(db, "bob", 1)
    assert _owners_of(db, 2) == ["alice", "bob"]
    assert _claim(db) is None  # alice holds 1 of 1; bob's only job runs
    default = ClaimPolicy(fair_share=True, quotas=QuotaDefaults(max_devices=3))
    _set_owner(db, "alice", max_devices=None)
    wide = _queue(db, "alice", processes=3)[0]
    claimed = [_claim(db, default) for _ in range(3)]
    # alice's two narrow jobs fit under the default of 3 (1 + 1 + 1); the wide one (3 more) never does.
    assert [job.num_processes if job else None for job in claimed] == [1, 1, None]
    with db.session() as session:
        assert jobs_repo.get_job(session, job_id=wide).status == JobStatus.queued


def test_device_hours_quota_skips_an_owner_who_used_its_day(db: Database) -> None:
    _set_owner(db, "alice", max_device_hours_per_day=1.0)
    done = _queue(db, "alice", processes=2)[0]
    now = utcnow()
    with db.session() as session, session.begin():
        session.execute(
            update(Job)
            .where(Job.id == done)
            .values(status=JobStatus.succeeded, started_at=now - timedelta(hours=1), finished_at=now)
        )
    _queue(db, "alice", 1)
    bob = _queue(db, "bob", 1)[0]
    assert _claim(db).id == bob  # type: ignore[union-attr]
    assert _claim(db) is None  # alice used 2 device-hours of 1


def test_a_wide_job_reserves_a_worker_which_then_claims_nothing_else(db: Database) -> None:
    policy = ClaimPolicy(fair_share=True, reservation_after_s=0.0)
    with db.session() as session:
        for worker in ("w1", "w2"):
            jobs_repo.register_worker(session, worker_id=worker, host="h", pid=1, devices=["cpu0", "cpu1"])
    wide = _queue(db, "alice", processes=2)[0]
    narrow = _queue(db, "bob", 3)
    # w1 has one device free: the wide job reserves it, and w1 takes no narrow job meanwhile.
    assert _claim(db, policy, "w1", max_processes=1, capacity=2) is None
    with db.session() as session:
        assert jobs_repo.get_job(session, job_id=wide).reserved_by == "w1"
    # w2 cannot reserve the same job (one worker per job): it takes a narrow one.
    assert _claim(db, policy, "w2", max_processes=1, capacity=2).id == narrow[0]  # type: ignore[union-attr]
    assert _claim(db, policy, "w1", max_processes=1, capacity=2) is None
    started = _claim(db, policy, "w1", max_processes=2, capacity=2)
    assert started is not None and started.id == wide and started.reserved_by is None


def test_a_reservation_of_a_gone_worker_is_void(db: Database) -> None:
    policy = ClaimPolicy(fair_share=True, reservation_after_s=0.0)
    with db.session() as session:
        for worker in ("w1", "w2"):
            jobs_repo.register_worker(session, worker_id=worker, host="h", pid=1, devices=["cpu0", "cpu1"])
    wide = _queue(db, "alice", processes=2)[0]
    assert _claim(db, policy, "w1", max_processes=1, capacity=2) is None
    with db.session() as session:
        jobs_repo.worker_stopped(session, worker_id="w1")
    assert _claim(db, policy, "w2", max_processes=1, capacity=2) is None
    with db.session() as session:
        assert jobs_repo.get_job(session, job_id=wide).reserved_by == "w2"


def test_waiting_for_says_reservation_and_backoff(db: Database) -> None:
    policy = ClaimPolicy(fair_share=True, reservation_after_s=0.0)
    with db.session() as session:
        jobs_repo.register_worker(session, worker_id="w1", host="h", pid=1, devices=["cpu0", "cpu1"])
    _queue(db, "bob", 1)
    assert _claim(db, policy, "w1", max_processes=2, capacity=2) is not None  # w1: 1 of 2 free
    wide = _queue(db, "alice", processes=2)[0]
    narrow, later = _queue(db, "bob", 2)
    assert _claim(db, policy, "w1", max_processes=1, capacity=2) is None  # the wide job reserves w1
    with db.session() as session, session.begin():
        session.execute(
            update(Job).where(Job.id == later).values(not_before=utcnow() + timedelta(hours=1), attempts=1)
        )
    with db.session() as session:
        jobs = [jobs_repo.get_job(session, job_id=i) for i in (wide, narrow, later)]
        reasons = waiting_for(session, jobs, policy)
    assert reasons[wide] == {
        "reason": "reservation",
        "message": "reserved worker w1; starts there once 2 of its devices are free",
    }
    assert reasons[narrow] == {
        "reason": "reservation",
        "message": f"waits for worker w1 reserved by job {wide}",
    }
    assert reasons[later]["reason"] == "retry_backoff" and "after attempt 1" in reasons[later]["message"]


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_claims_side_by_side_never_take_an_owner_past_its_device_quota(db: Database) -> None:
    # Postgres runs claims at once (SQLite's write lock serialises them): eight workers claiming
    # together must not each see alice one device below her limit of 1 and all take one of hers.
    _set_owner(db, "alice", max_devices=1)
    _queue(db, "alice", 8)
    start = threading.Barrier(8)

    def claim(worker: str) -> Job | None:
        start.wait()
        return _claim(db, worker=worker)

    with ThreadPoolExecutor(8) as pool:
        claimed = [job for job in pool.map(claim, [f"w{n}" for n in range(8)]) if job is not None]
    assert len(claimed) == 1
    with db.session() as session, session.begin():
        running = session.scalars(select(Job.id).where(Job.status == JobStatus.running)).all()
    assert running == [claimed[0].id]
