"""Issue 37's gang at the level of the repository, on both databases: rank 0's claim opens a gang with
its rendezvous, free workers join it rank by rank until it is full (never two on one rank, never a
worker twice, never past its size), a member's heartbeat says whether its seat still stands, a member
silent for a lease is named to rank 0, and a gang not full in time goes back to the queue without
spending an attempt, fencing its members."""

from __future__ import annotations

from datetime import timedelta

from shared import jobs_repo
from shared.core.db import Database
from shared.core.tables import JobGang, JobStatus, utcnow
from shared.jobs_repo import gangs
from tests.support import kit
from tests.support.dbutil import claimed, count_rows

LEASE_S = 60


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
        assert gangs.stale_members(session, rank0, lease_s=LEASE_S, now=later) == [2]

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
