"""Fencing, idempotent reporting, retries with backoff, the idle claim, the worker registry and the
child's liveness watch: the fleet's promises at the level of the repository and of real processes.
Both databases where it matters."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import make_url, select

from shared import jobs_repo
from shared.core.db import Database, read
from shared.core.errors import StaleClaim
from shared.core.tables import ErrorCode, JobEvent, JobMetric, JobStatus, Worker, utcnow
from shared.jobs_repo import Claim, MetricRow
from tests.support import kit
from tests.support.dbutil import claimed
from tests.support.e2e import LOOPBACK_URL, running
from worker.fleet.db_reporter import QueuedReporter
from worker.fleet.liveness import ORPHANED_EXIT, WORKER_PID_ENV

SPEC = {**kit.SPEC, "seed": 1}
REPO = Path(__file__).resolve().parents[2]


def _claimed(db: Database, worker_id: str = "w1", lease_s: float = 60) -> Claim:
    with db.session() as session:
        return claimed(session, worker_id=worker_id, lease_s=lease_s)


def test_a_stale_attempts_writes_are_refused(db: Database) -> None:
    with db.session() as session:
        jobs_repo.create_job(session, spec=SPEC)
    first = _claimed(db, "w1")
    later = utcnow() + timedelta(seconds=120)
    with db.session() as session:
        jobs_repo.add_metrics(
            session, job_id=first.job_id, rows=[MetricRow(1.0, 1, "train", "loss", 0.5)], claim=first
        )
        jobs_repo.recover_expired_leases(session, now=later)  # w1's lease ran out
    second = _claimed(db, "w2")
    assert second.attempt == 2

    stale_writes = [
        lambda s: jobs_repo.add_metrics(
            s, job_id=first.job_id, rows=[MetricRow(1.0, 2, "train", "loss", 0.4)], claim=first
        ),
        lambda s: jobs_repo.add_checkpoint(
            s, job_id=first.job_id, step=2, epoch=1.0, path="/c/2", metrics={}, claim=first
        ),
        lambda s: jobs_repo.delete_checkpoints(s, job_id=first.job_id, steps=[1], claim=first),
        lambda s: jobs_repo.add_event(s, job_id=first.job_id, message="late", claim=first),
        lambda s: jobs_repo.set_result(s, job_id=first.job_id, result={"late": True}, claim=first),
        lambda s: jobs_repo.set_environment(s, job_id=first.job_id, environment={}, claim=first),
    ]
    with db.session() as session:
        for write in stale_writes:
            with pytest.raises(StaleClaim):
                write(session)
        # The same worker with an old attempt number is stale too.
        with pytest.raises(StaleClaim):
            jobs_repo.add_event(
                session, job_id=first.job_id, message="x", claim=Claim(first.job_id, "w2", first.attempt)
            )
        jobs_repo.add_metrics(
            session, job_id=second.job_id, rows=[MetricRow(1.0, 2, "train", "loss", 0.3)], claim=second
        )
        with read(session):
            rows = session.execute(select(JobMetric.step, JobMetric.value, JobMetric.attempt)).all()
        job = jobs_repo.get_job(session, job_id=first.job_id)
        messages = [e.message for e in jobs_repo.list_events(session, job_id=first.job_id)[0]]
        checkpoints = jobs_repo.list_checkpoints(session, job_id=first.job_id)
    assert sorted(rows) == [(1, 0.5, 1), (2, 0.3, 2)]
    assert job.result is None and job.environment is None
    assert "late" not in messages and not checkpoints


def test_a_retried_write_adds_no_second_row(db: Database) -> None:
    with db.session() as session:
        jobs_repo.create_job(session, spec=SPEC)
    claim = _claimed(db)
    rows = [MetricRow(1.0, 4, "eval", "accuracy", 0.75)]
    with db.session() as session:
        for _ in range(2):  # the first commit's acknowledgement "lost": the flusher writes again
            jobs_repo.add_metrics(
                session, job_id=claim.job_id, rows=rows, claim=claim, best_metric="accuracy"
            )
            jobs_repo.add_event(session, job_id=claim.job_id, message="hello", claim=claim, dedup_key="1-1")
            jobs_repo.add_checkpoint(
                session,
                job_id=claim.job_id,
                step=4,
                epoch=1.0,
                path="/c/4",
                metrics={"accuracy": 0.75},
                claim=claim,
                dedup_key="1-2",
            )
        with read(session):
            events = session.scalars(select(JobEvent.message).where(JobEvent.job_id == claim.job_id)).all()
            metrics = session.scalars(select(JobMetric.id)).all()
    assert len(metrics) == 1
    assert events.count("hello") == 1 and events.count("checkpoint at step 4") == 1


def test_failures_outside_the_job_retry_after_a_backoff_and_the_jobs_own_fail_at_once(db: Database) -> None:
    with db.session() as session:
        retried = jobs_repo.create_job(session, spec=SPEC, priority=1).id
        jobs_repo.create_job(session, spec=SPEC)
    claim = _claimed(db)
    assert claim.job_id == retried
    with db.session() as session:
        status = jobs_repo.fail_job(
            session,
            claim=claim,
            error_code=ErrorCode.killed,
            error="the job's process was killed by SIGKILL",
            retry_base_s=0.8,
            retry_cap_s=60,
        )
        assert status == JobStatus.queued
        waiting = jobs_repo.get_job(session, job_id=retried)
        assert waiting.not_before is not None and waiting.error_code == ErrorCode.killed
        # Within its backoff the retried job is skipped: the other one is claimed.
        other = jobs_repo.claim_next(session, worker_id="w2", lease_s=60)
        assert other is not None and other.id != retried
        bad = jobs_repo.fail_job(
            session,
            claim=Claim(other.id, "w2", 1),
            error_code=ErrorCode.invalid_data,
            error="labels that do not fit",
            retry_base_s=0.8,
            retry_cap_s=60,
        )
        assert bad == JobStatus.failed
        assert jobs_repo.claim_next(session, worker_id="w3", lease_s=60) is None
        time.sleep(1.0)
        again = jobs_repo.claim_next(session, worker_id="w3", lease_s=60)
        failed = jobs_repo.get_job(session, job_id=other.id)
    assert again is not None and again.id == retried and again.attempts == 2 and again.not_before is None
    assert failed.attempts == 1 and failed.error_code == ErrorCode.invalid_data


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_idle_poll_takes_no_write_lock(db_url: str) -> None:
    """With SQLite's write lock held elsewhere (the API writing), an idle worker's poll answers at once;
    a poll that opened a write transaction would wait for the lock (here: fail after 1 s)."""
    path = make_url(db_url).database
    db = Database(f"{db_url}?timeout=1")
    holder = sqlite3.connect(str(path), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        for _ in range(20):
            with db.session() as session:
                assert jobs_repo.claim_next(session, worker_id="idle", lease_s=60) is None
                assert jobs_repo.recover_expired_leases(session) == []
        assert time.monotonic() - started < 1.0
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        db.dispose()


def test_the_flusher_rides_out_a_held_write_lock_and_keeps_order(tmp_path: Path, sqlite_url: str) -> None:
    path = make_url(sqlite_url).database
    db = Database(f"{sqlite_url}?timeout=0.2")
    with db.session() as session:
        jobs_repo.create_job(session, spec=SPEC)
    claim = _claimed(db)
    reporter = QueuedReporter(db, claim)
    holder = sqlite3.connect(str(path), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        for step in range(1, 51):
            reporter.metrics(step=step, epoch=step / 50, split="train", values={"loss": 1 / step})
            reporter.log(f"step {step}")
        assert time.monotonic() - started < 0.5  # the training loop never waited
        time.sleep(1.0)
        assert reporter.pending == 100  # nothing could be written yet
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert reporter.close(timeout_s=30)
    with db.session() as session, read(session):
        steps = session.scalars(select(JobMetric.step).order_by(JobMetric.id)).all()
        logs = session.scalars(
            select(JobEvent.message).where(JobEvent.kind == "log").order_by(JobEvent.id)
        ).all()
    db.dispose()
    assert steps == list(range(1, 51))
    assert logs == [f"step {step}" for step in range(1, 51)]


def test_the_flusher_stops_a_stale_attempt(db: Database) -> None:
    with db.session() as session:
        jobs_repo.create_job(session, spec=SPEC)
        jobs_repo.claim_next(session, worker_id="w1", lease_s=60)
    stale = Claim(job_id=1, worker_id="w0", attempt=1)
    stopped: list[StaleClaim] = []
    reporter = QueuedReporter(db, stale, on_stale=stopped.append)
    reporter.metrics(step=1, epoch=0.1, split="train", values={"loss": 1.0})
    with pytest.raises(StaleClaim):
        reporter.checkpoint(step=1, epoch=0.1, path="/c/1", metrics={}, is_best=False)
    assert len(stopped) == 1
    with db.session() as session, read(session):
        assert session.scalars(select(JobMetric.id)).all() == []


def test_workers_listing_derives_gone_and_shows_current_jobs(db: Database) -> None:
    with db.session() as session:
        jobs_repo.register_worker(
            session, worker_id="a", host="h1", pid=1, devices=["0", "1"], version="0.1.0"
        )
        jobs_repo.register_worker(session, worker_id="b", host="h2", pid=2, devices=["cpu0"])
        jobs_repo.create_job(session, spec=SPEC, owner="alice")
        job = jobs_repo.claim_next(session, worker_id="a", lease_s=60)
        assert job is not None
        jobs_repo.touch_worker(session, worker_id="a", state="busy")
        now = utcnow() + timedelta(seconds=61)
        with db.session() as other:
            other.begin()
            other.execute(
                Worker.__table__.update().where(Worker.id == "b").values(last_heartbeat_at=utcnow())
            )
            other.commit()
        views = {w.id: w for w in jobs_repo.list_workers(session, lease_s=60, now=now)}
        theirs = {w.id: w for w in jobs_repo.list_workers(session, lease_s=60, owner="bob")}
        old = utcnow() + timedelta(days=2)
        assert jobs_repo.prune_workers(session, now=old) == 2
    assert views["a"].state == "gone" and views["a"].jobs == [
        {"id": job.id, "attempt": 1, "status": JobStatus.running, "devices": None}
    ]
    assert views["a"].devices == ["0", "1"] and views["a"].version == "0.1.0"
    assert theirs["a"].state == "busy" and theirs["a"].jobs == []  # bob sees the worker, not alice's job


def _python(code: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], env=env, cwd=REPO, start_new_session=True)


@pytest.mark.e2e
def test_a_job_process_exits_when_its_worker_dies_even_through_an_intermediate(tmp_path: Path) -> None:
    """The "worker" is a sleeping process; the job process is its grandchild (as under a template
    process or `accelerate launch`), in a session of its own. SIGKILL of the worker alone ends it."""
    pid_file = tmp_path / "job.pid"
    job = tmp_path / "job.py"
    job.write_text(
        "import os, sys, time\n"
        "from worker.fleet.liveness import watch_worker\n"
        "watch_worker()\n"
        "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
        "time.sleep(120)\n"
    )
    middle = tmp_path / "middle.py"  # starts the job process and exits: the job is nobody's child
    middle.write_text(
        "import subprocess, sys\nsubprocess.Popen([sys.executable, *sys.argv[1:]], start_new_session=True)\n"
    )
    fake_worker = tmp_path / "fake_worker.py"
    fake_worker.write_text(
        "import os, subprocess, sys, time\n"
        f"env = dict(os.environ, {WORKER_PID_ENV}=str(os.getpid()))\n"
        "subprocess.run([sys.executable, *sys.argv[1:]], env=env)\n"
        "time.sleep(120)\n"
    )
    worker = subprocess.Popen(
        [sys.executable, str(fake_worker), str(middle), str(job), str(pid_file)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=REPO,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text()):
            assert time.monotonic() < deadline, "the job process did not start"
            time.sleep(0.1)
        job_pid = int(pid_file.read_text())
        assert running(job_pid)
        os.kill(worker.pid, signal.SIGKILL)  # the worker only: not its group, not the job
        worker.wait(10)
        killed_at = time.monotonic()
        while running(job_pid):
            assert time.monotonic() - killed_at < 5, "the orphaned job process kept running"
            time.sleep(0.05)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def test_the_orphan_exit_status(tmp_path: Path) -> None:
    """A job process whose worker is already gone does not even start."""
    gone = _python("pass", dict(os.environ))
    gone.wait()
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "from worker.fleet.liveness import watch_worker; watch_worker(); import time; time.sleep(30)",
        ],
        env={**os.environ, "PYTHONPATH": str(REPO), WORKER_PID_ENV: str(gone.pid)},
        cwd=REPO,
        timeout=30,
    )
    assert child.returncode == ORPHANED_EXIT


def test_thread_safety_of_the_reporter_queue_under_many_producers(db: Database) -> None:
    with db.session() as session:
        jobs_repo.create_job(session, spec=SPEC)
    claim = _claimed(db)
    reporter = QueuedReporter(db, claim, max_pending=8)  # tiny: producers wait for room
    threads = [
        threading.Thread(
            target=lambda k=k: [
                reporter.metrics(step=k * 100 + i, epoch=0.0, split="train", values={"loss": 0.1})
                for i in range(20)
            ]
        )
        for k in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert reporter.close(timeout_s=60)
    with db.session() as session, read(session):
        assert len(session.scalars(select(JobMetric.id)).all()) == 60


def test_get_workers_every_key_sees_the_fleet_only_an_admin_sees_others_jobs(
    settings_factory: Any, db_url: str, db: Database
) -> None:
    from fastapi.testclient import TestClient

    from service.main import create_app
    from shared.core.config import secret_digest

    settings = settings_factory(db_url, api_keys=["alice-key", "bob-key"], admin_keys=["root-key"])
    with db.session() as session:
        jobs_repo.register_worker(
            session, worker_id="w1", host="gpu-1", pid=42, devices=["0"], version="0.1.0"
        )
        job = jobs_repo.create_job(session, spec=SPEC, owner=secret_digest("alice-key"))
        jobs_repo.claim_next(session, worker_id="w1", lease_s=60)
    client = TestClient(create_app(settings, db), base_url=LOOPBACK_URL)

    def workers(key: str) -> list[dict[str, Any]]:
        response = client.get("/v1/workers", headers={"Authorization": f"Bearer {key}"})
        assert response.status_code == 200, response.text
        data: list[dict[str, Any]] = response.json()["data"]
        return data

    assert client.get("/v1/workers").status_code == 401
    (alice,) = workers("alice-key")
    (bob,) = workers("bob-key")
    (root,) = workers("root-key")
    assert alice["host"] == "gpu-1" and alice["pid"] == 42 and alice["devices"] == ["0"]
    assert alice["version"] == "0.1.0" and alice["state"] == "idle"
    assert [j["id"] for j in alice["jobs"]] == [job.id] and alice["jobs"][0]["attempt"] == 1
    assert bob["jobs"] == [] and [j["id"] for j in root["jobs"]] == [job.id]
