"""worker/fleet/gang_watch.py on SQLite (issue 37): rank 0's wait for a full gang releases one that stays
short; a member's watch says stop once its gang is closed; rank 0's says so once a member falls
silent for a lease. Short leases and intervals: a few seconds in all."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from shared import jobs_repo
from shared.core.db import Database
from shared.core.tables import JobStatus
from shared.jobs_repo import gangs
from tests.support import kit
from tests.support.dbutil import claimed
from worker.fleet.gang_watch import GangWatch, wait_until_full

LEASE_S = 1.0


@pytest.fixture
def db(sqlite_url: str) -> Iterator[Database]:
    database = Database(sqlite_url)
    yield database
    database.dispose()


def _open(db: Database, size: int = 2) -> gangs.Seat:
    with db.session() as session:
        for name in ("a", "b"):
            jobs_repo.register_worker(session, worker_id=name, host=name, pid=1, devices=["cpu0"])
        job_id = jobs_repo.create_job(session, spec={**kit.SPEC, "seed": 1}).id
        seat = gangs.open_gang(
            session, claim=claimed(session, job_id, worker_id="a"), size=size, address="h", port=1
        )
        assert seat is not None
        return seat


def _watch(db: Database, seat: gangs.Seat) -> tuple[GangWatch, threading.Event]:
    lost = threading.Event()
    watch = GangWatch(db, seat, lease_s=LEASE_S, interval_s=0.1, on_lost=lambda _reason: lost.set())
    watch.start()
    return watch, lost


def test_a_gang_not_full_in_time_is_released(db: Database) -> None:
    seat = _open(db)

    assert not wait_until_full(db, seat, bound_s=0.3, poll_s=0.05)
    with db.session() as session:
        job = jobs_repo.get_job(session, job_id=seat.job_id)
    assert (job.status, job.attempts) == (JobStatus.queued, 0)


def test_members_are_told_when_the_attempt_cannot_go_on(db: Database) -> None:
    rank0 = _open(db)
    with db.session() as session:
        rank1 = gangs.join_gang(session, worker_id="b", max_processes=1, lease_s=60)
    assert rank1 is not None and wait_until_full(db, rank0, bound_s=1)

    # Rank 1 falls silent (no watch of its own): rank 0 is told within about a lease.
    watch0, lost0 = _watch(db, rank0)
    assert lost0.wait(LEASE_S * 4) and watch0.lost is not None and "worker b (machine rank 1)" in watch0.lost
    watch0.stop()

    # Rank 0 closes the gang (the attempt ended): rank 1's watch says stop at its next beat.
    watch1, lost1 = _watch(db, rank1)
    assert not lost1.wait(0.3)  # its seat stands until then
    with db.session() as session:
        gangs.close_gang(session, rank0)
    assert lost1.wait(2) and watch1.lost is not None and "has ended" in watch1.lost
    watch1.stop()
