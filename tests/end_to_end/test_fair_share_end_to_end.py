"""A team's shared fleet with real worker processes (issue 16):

- fair share: alice queues 20 jobs, then bob 3; two one-slot workers start bob's three before
  alice's sixth, and every job runs once;
- a running-devices quota of 1 runs alice's jobs one at a time while bob's run beside them;
- a wide job (2 processes) amid a stream of one-slot jobs on two 2-slot workers reserves a worker
  once it has waited past GLUEJOBS_RESERVATION_AFTER_S and starts there; one-slot jobs run after it.

Start times are read from the database (started_at, finished_at), never inferred from sleeps.

Each runs on one database: the claim's rules (fair share, the device quota, the reservation) are the
claim's SQL, which tests/shared/test_fair_share.py holds on both databases, and claims racing from several
workers are tests/shared/test_queue.py's, on both; what these add is real workers going by those rules. Two
workers racing run on Postgres, a fleet's database; the one worker with three slots on SQLite. (Each on
both databases cost the suite about three more minutes.)
"""

from __future__ import annotations

import os
import signal
import subprocess
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from service.accounts.owner_views import set_owner_quota
from shared import jobs_repo
from shared.core.config import Settings
from shared.core.db import Database, read
from shared.core.tables import Job, JobEvent, JobStatus
from shared.scheduling.quotas import QuotaDefaults
from tests.support.e2e import start_worker, wait_for
from tests.support.kit import QUICK_JOB

pytestmark = pytest.mark.e2e

NOOP = {"model_name_or_path": "tiny-bert", "task_name": "sst2", "seed": 1, "noop": True}


def _queue(
    db: Database, owner: str, count: int, spec: dict[str, Any] = QUICK_JOB, *, priority: int = 0
) -> list[int]:
    with db.session() as session:
        return [
            jobs_repo.create_job(session, spec={**spec, "seed": i}, owner=owner, priority=priority).id
            for i in range(count)
        ]


def _jobs(db: Database) -> dict[int, Job]:
    with db.session() as session, read(session):
        return {job.id: job for job in session.query(Job).all()}


def _claims(db: Database) -> list[int]:
    with db.session() as session, read(session):
        events = session.query(JobEvent).all()
    return sorted(e.job_id for e in events if e.message.startswith("claimed by worker"))


def _drain(settings: Settings, tmp_path: Path, workers: int, *args: str) -> None:
    processes = [
        start_worker(settings, "--exit-when-idle", *args, log=tmp_path / f"worker{i}.log")
        for i in range(workers)
    ]
    try:
        for i, process in enumerate(processes):
            assert process.wait(600) == 0, (tmp_path / f"worker{i}.log").read_text()[-3000:]
    finally:
        _kill(processes)


def _kill(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def _all_ran_once(jobs: dict[int, Job], claims: list[int]) -> None:
    assert all(job.status == JobStatus.succeeded and job.attempts == 1 for job in jobs.values()), [
        (job.id, job.status, job.error) for job in jobs.values() if job.status != JobStatus.succeeded
    ]
    assert claims == sorted(jobs)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_bobs_three_jobs_start_before_alices_sixth(
    settings_factory: Any, db_url: str, db: Database, tmp_path: Path
) -> None:
    settings: Settings = settings_factory(db_url)
    alice = _queue(db, "alice", 20)
    bob = _queue(db, "bob", 3)
    _drain(settings, tmp_path, 2)

    jobs = _jobs(db)
    _all_ran_once(jobs, _claims(db))
    started: dict[int, datetime] = {i: j.started_at for i, j in jobs.items() if j.started_at is not None}
    alices_sixth = sorted(started[i] for i in alice)[5]
    assert all(started[i] < alices_sixth for i in bob), {i: started[i].isoformat() for i in bob}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_device_quota_of_one_runs_alices_jobs_one_at_a_time_beside_bobs(
    settings_factory: Any, db_url: str, db: Database, tmp_path: Path
) -> None:
    settings: Settings = settings_factory(db_url)
    with db.session() as session:
        set_owner_quota(
            session,
            name="alice",
            changes={"max_devices": 1},
            actor=None,
            actor_key_id=None,
            defaults=QuotaDefaults(),
        )
    alice = _queue(db, "alice", 3)
    bob = _queue(db, "bob", 3)
    _drain(settings, tmp_path, 1, "--slots", "3")

    jobs = _jobs(db)
    _all_ran_once(jobs, _claims(db))
    spans = sorted((jobs[i].started_at, jobs[i].finished_at) for i in alice)
    for (_, end), (start, _) in pairwise(spans):
        assert end is not None and start is not None and end <= start, spans  # never two at once
    beside = [b for b in bob if any(_overlap(jobs[b], jobs[a]) for a in alice)]
    assert beside, "no job of bob's ran beside one of alice's"


def _overlap(one: Job, other: Job) -> bool:
    assert one.started_at and one.finished_at and other.started_at and other.finished_at
    return one.started_at < other.finished_at and other.started_at < one.finished_at


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_wide_job_reserves_a_worker_amid_a_stream_of_narrow_ones(
    settings_factory: Any, db_url: str, db: Database, tmp_path: Path
) -> None:
    bound_s = 2.0
    settings: Settings = settings_factory(db_url, reservation_after_s=bound_s)
    workers = [start_worker(settings, "--slots", "2", log=tmp_path / f"worker{i}.log") for i in range(2)]
    try:
        # One owner, the narrow jobs at a higher priority: without a reservation the wide job would
        # start only when a worker had both slots free and no narrow job waited, which the stream
        # never allows.
        _queue(db, "bob", 6, NOOP, priority=5)
        wide = _queue(db, "bob", 1, {**QUICK_JOB, "num_processes": 2, "max_train_samples": 16})[0]

        def wide_started() -> bool:
            queued = [j for j in _jobs(db).values() if j.status == JobStatus.queued and j.id != wide]
            if len(queued) < 4:  # the stream: always narrow jobs waiting for any slot that frees up
                _queue(db, "bob", 4, NOOP, priority=5)
            return _jobs(db)[wide].status != JobStatus.queued

        wait_for(wide_started, timeout_s=300, interval_s=0.2)
        after = _queue(db, "bob", 4, NOOP, priority=5)
        wait_for(lambda: all(j.status.is_terminal for j in _jobs(db).values()), timeout_s=300)
    finally:
        for process in workers:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in workers:
            process.wait(60)
        _kill(workers)

    jobs = _jobs(db)
    _all_ran_once(jobs, _claims(db))
    job = jobs[wide]
    assert job.started_at is not None and job.devices is not None and len(job.devices) == 2
    with db.session() as session, read(session):
        messages = [e.message for e in session.query(JobEvent).filter(JobEvent.job_id == wide)]
    assert any(m.startswith("reserved worker") for m in messages), messages
    # Started within the bound, plus the time the reserving worker's one running narrow job took.
    waited = (job.started_at - job.created_at).total_seconds()
    assert waited < bound_s + 60, waited
    assert any(jobs[i].started_at and jobs[i].started_at > job.started_at for i in after)
