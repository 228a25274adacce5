"""Issue 37's gang at the level of the repository, on both databases: rank 0's claim opens a gang with
its rendezvous, free workers join it rank by rank until it is full (never two on one rank, never a
worker twice, never past its size), a member's heartbeat says whether its seat still stands, a member
silent for a lease is named to rank 0, and a gang not full in time goes back to the queue without
spending an attempt, fencing its members. And how the scheduler treats gangs (reservations.gang_hold,
wait_reasons): the workers a gang still needs hold for it, the others backfill, and a queued gang job
says how many free workers it waits for."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy.orm import Session

from shared import jobs_repo
from shared.core.db import Database, read
from shared.core.tables import JobGang, JobStatus, utcnow
from shared.jobs_repo import gangs, reservations
from shared.scheduling.fair_share import ClaimPolicy
from shared.scheduling.machines import seats_by_worker
from shared.scheduling.quotas import QuotaDefaults, device_hours_24h, devices_held
from shared.scheduling.wait_reasons import waiting_for
from tests.support import kit
from tests.support.dbutil import claimed, count_rows

LEASE_S = 60
GANG_SPEC = {**kit.SPEC, "seed": 1, "num_processes": 2}


def test_a_gang_fills_rank_by_rank_and_fences_its_members_once_released(db: Database) -> None:
    with db.session() as session:
        for name in ("a", "b", "c", "d"):
            jobs_repo.register_worker(session, worker_id=name, host=f"{name}.local", pid=1, devices=["cpu0"])
        job_id = jobs_repo.create_job(session, spec={**kit.SPEC, "seed": 1}).id
        # No gang is open yet: a free worker finds none to join.
        assert gangs.join_gang(session, worker_id="b", max_processes=1, lease_s=LEASE_S) is None

        claim = claimed(session, job_id, worker_id="a")
        rank0 = gangs.open_gang(session, claim=claim, size=3, address="127.0.0.2", port=29511)
        assert rank0 is not None and (rank0.rank, rank0.size, rank0.attempt) == (0, 3, 1)
        # The opener does not join its own gang; a worker without room for the job's processes neither.
        assert gangs.join_gang(session, worker_id="a", max_processes=1, lease_s=LEASE_S) is None
        assert gangs.join_gang(session, worker_id="b", max_processes=0, lease_s=LEASE_S) is None

        rank1 = gangs.join_gang(session, worker_id="b", max_processes=1, lease_s=LEASE_S)
        assert rank1 is not None and (rank1.rank, rank1.address, rank1.port) == (1, "127.0.0.2", 29511)
        assert gangs.join_gang(session, worker_id="b", max_processes=1, lease_s=LEASE_S) is None  # once
        assert not gangs.gang_full(session, rank0)
        rank2 = gangs.join_gang(session, worker_id="c", max_processes=4, lease_s=LEASE_S)
        assert rank2 is not None and rank2.rank == 2 and gangs.gang_full(session, rank0)
        assert gangs.join_gang(session, worker_id="d", max_processes=1, lease_s=LEASE_S) is None  # full

        # Heartbeats: every seat stands; one silent for a lease is named to rank 0.
        assert all(gangs.beat(session, seat) for seat in (rank0, rank1, rank2))
        later = utcnow() + timedelta(seconds=LEASE_S + 1)
        assert gangs.beat(session, rank0, now=later) and gangs.beat(session, rank1, now=later)
        assert gangs.stale_members(session, rank0, lease_s=LEASE_S, now=later) == [(2, "c")]

        # Released (here as if not full in time): no attempt spent, every seat fenced, rows gone.
        assert gangs.release_unfilled(session, seat=rank0, waited_s=30)
        assert not any(gangs.beat(session, seat) for seat in (rank0, rank1, rank2))
        job = jobs_repo.get_job(session, job_id=job_id)
        assert (job.status, job.attempts, job.worker_id) == (JobStatus.queued, 0, None)
        messages = [e.message for e in jobs_repo.list_events(session, job_id=job_id)[0]]
        assert any("joined the gang as machine rank 2 of 3" in m for m in messages), messages
        assert any("its gang of 3 machines was not full within 30s" in m for m in messages), messages
    assert count_rows(db, JobGang) == 0

    # The next attempt is a new gang, and a seat of the old one never counts as the new one's.
    with db.session() as session:
        again = claimed(session, job_id, worker_id="c")
        assert again.attempt == 1
        new0 = gangs.open_gang(session, claim=again, size=2, address="127.0.0.3", port=29512)
        assert new0 is not None and new0.token != rank0.token  # its id may be the old one's (SQLite)
        assert not gangs.beat(session, rank1)
        assert gangs.open_gang(session, claim=claim, size=2, address="x", port=1) is None  # a stale claim
        joined = gangs.join_gang(session, worker_id="b", max_processes=1, lease_s=LEASE_S)
        assert joined is not None and (joined.gang_id, joined.rank) == (new0.gang_id, 1)
        assert not gangs.beat(session, rank1)  # b's old seat, though b holds rank 1 again
        # A cancel stops every member: the attempt is no longer running.
        jobs_repo.request_cancel(session, job_id=job_id)
        assert not gangs.beat(session, joined)
        gangs.close_gang(session, new0)
    assert count_rows(db, JobGang) == 0


def test_a_gang_whose_rank0_is_gone_is_not_joined(db: Database) -> None:
    with db.session() as session:
        for name in ("a", "b"):
            jobs_repo.register_worker(session, worker_id=name, host=name, pid=1, devices=["cpu0"])
        job_id = jobs_repo.create_job(session, spec={**kit.SPEC, "seed": 1}).id
        claim = claimed(session, job_id, worker_id="a")
        assert gangs.open_gang(session, claim=claim, size=2, address="127.0.0.2", port=29513) is not None
        gone = utcnow() + timedelta(seconds=LEASE_S + 1)
        assert gangs.join_gang(session, worker_id="b", max_processes=1, lease_s=LEASE_S, now=gone) is None


HOLD = ClaimPolicy(reservation_after_s=0.0, lease_s=LEASE_S)  # reservations on, every job past the bound


def _claim(session: Session, worker: str, *, free: int, policy: ClaimPolicy = HOLD) -> int | None:
    job = jobs_repo.claim_next(
        session, worker_id=worker, lease_s=LEASE_S, max_processes=free, capacity=2, policy=policy
    )
    return None if job is None else job.id


def _holds(session: Session, worker: str, policy: ClaimPolicy) -> int | None:
    with read(session):
        return reservations.gang_hold(session, worker_id=worker, policy=policy, now=utcnow())


def test_workers_hold_for_a_gang_still_filling_and_the_rest_backfill(db: Database) -> None:
    """A gang of 3 machines × 2 devices opened by a: of b, c and e (2 devices each, one busy), the two
    it still needs hold for it (most free first, then by id: b and c), claiming nothing smaller; e
    backfills; a member's seat is busy; with reservations off nobody holds; a full gang holds nobody."""
    with db.session() as session:
        for name in ("a", "b", "c", "e"):
            jobs_repo.register_worker(session, worker_id=name, host=name, pid=1, devices=["0", "1"])
        gang_job = jobs_repo.create_job(session, spec={**GANG_SPEC, "num_machines": 3}).id
        ones = [jobs_repo.create_job(session, spec={**kit.SPEC, "seed": 1}).id for _ in range(3)]
        rank0 = claimed(session, gang_job, worker_id="a")
        busy = {
            worker: claimed(session, job, worker_id=worker) for worker, job in zip("bce", ones, strict=True)
        }
        seat0 = gangs.open_gang(session, claim=rank0, size=3, address="127.0.0.2", port=29514)
        assert seat0 is not None
        small = jobs_repo.create_job(session, spec={**kit.SPEC, "seed": 2}).id

        assert _holds(session, "b", HOLD) == gang_job
        assert _claim(session, "b", free=1) is None and _claim(session, "c", free=1) is None
        assert _claim(session, "e", free=1) == small  # not needed by the gang: it backfills
        # Reservations off (no bound to pass): the gang's workers are nobody's to hold.
        assert _holds(session, "b", ClaimPolicy()) is None

        # b's job ends: it joins, and its seat holds 2 of its devices; c is the one still held.
        assert jobs_repo.finish_job(session, claim=busy["b"], status=JobStatus.succeeded)
        seat1 = gangs.join_gang(session, worker_id="b", max_processes=2, lease_s=LEASE_S)
        assert seat1 is not None and seat1.rank == 1
        with read(session):
            assert seats_by_worker(session) == {"b": 2}
        assert _holds(session, "b", HOLD) is None
        assert _holds(session, "c", HOLD) == gang_job
        later = jobs_repo.create_job(session, spec={**kit.SPEC, "seed": 3}).id
        assert _claim(session, "c", free=1) is None

        # c's job ends and it joins: the gang is full, nobody holds, c may claim again.
        assert jobs_repo.finish_job(session, claim=busy["c"], status=JobStatus.succeeded)
        assert gangs.join_gang(session, worker_id="c", max_processes=2, lease_s=LEASE_S) is not None
        assert gangs.gang_full(session, seat0)
        assert _holds(session, "e", HOLD) is None
        assert _claim(session, "e", free=1) == later


def test_a_gang_job_waits_for_that_many_free_workers_and_says_so(db: Database) -> None:
    policy = ClaimPolicy(lease_s=LEASE_S)
    with db.session() as session:
        jobs_repo.register_worker(session, worker_id="a", host="a", pid=1, devices=["0", "1"])
        jobs_repo.register_worker(session, worker_id="b", host="b", pid=1, devices=["0", "1"])
        jobs_repo.register_worker(session, worker_id="d", host="d", pid=1, devices=["0"])
        job_id = jobs_repo.create_job(session, spec={**GANG_SPEC, "num_machines": 3}).id

        def reason() -> str | None:
            job = jobs_repo.get_job(session, job_id=job_id)
            return waiting_for(session, [job], policy).get(job_id, {}).get("message")

        assert reason() == "needs 3 workers with 2 devices each; only 2 running have that many"
        jobs_repo.register_worker(session, worker_id="c", host="c", pid=1, devices=["0", "1"])
        assert reason() is None  # three free: it starts on them
        # c takes a one-device job, and d opens a gang that b joins: b's seat is busy too.
        one = jobs_repo.create_job(session, spec={**kit.SPEC, "seed": 1, "num_processes": 1}, priority=5).id
        claimed(session, one, worker_id="c")
        other = jobs_repo.create_job(session, spec={**kit.SPEC, "seed": 2, "num_machines": 2}, priority=5).id
        seat = gangs.open_gang(
            session, claim=claimed(session, other, worker_id="d"), size=2, address="x", port=1
        )
        assert seat is not None
        assert gangs.join_gang(session, worker_id="b", max_processes=2, lease_s=LEASE_S) is not None
        assert reason() == "waiting for 3 free workers with 2 devices each (1 free now)"


def test_quotas_and_device_hours_count_every_machine_of_a_gang(db: Database) -> None:
    """A job of 2 machines × 2 processes holds 4 devices: an owner's max_devices of 3 keeps it queued
    (the reason names both figures), one of 4 lets it start, and while it runs the owner holds 4
    devices and spends 4 device-hours an hour."""
    policy = ClaimPolicy(lease_s=LEASE_S, quotas=QuotaDefaults(max_devices=3))
    with db.session() as session:
        jobs_repo.register_worker(session, worker_id="a", host="a", pid=1, devices=["0", "1"])
        job_id = jobs_repo.create_job(session, spec={**GANG_SPEC, "num_machines": 2}, owner="ada").id
        job = jobs_repo.get_job(session, job_id=job_id)
        reason = waiting_for(session, [job], policy)[job_id]["message"]
        assert "ada holds 0 of 3 devices (max_devices); this job needs 4 devices (2 machines × 2)" in reason
        assert (
            jobs_repo.claim_next(session, worker_id="a", lease_s=LEASE_S, max_processes=2, policy=policy)
            is None
        )

        roomy = ClaimPolicy(lease_s=LEASE_S, quotas=QuotaDefaults(max_devices=4))
        started = jobs_repo.claim_next(session, worker_id="a", lease_s=LEASE_S, max_processes=2, policy=roomy)
        assert started is not None and started.id == job_id
        with read(session):
            assert devices_held(session, ["ada"]) == {"ada": 4}
            hour_later = utcnow() + timedelta(hours=1)
            assert device_hours_24h(session, ["ada"], now=hour_later)["ada"] == pytest.approx(4.0, rel=1e-3)
