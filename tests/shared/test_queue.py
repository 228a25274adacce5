"""The queue on both databases: atomic claims under contention, leases, idempotent rows, the schema."""

from __future__ import annotations

import multiprocessing
import threading
from datetime import timedelta

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from shared import jobs_repo
from shared.core.db import Database
from shared.core.tables import Base, JobStatus, utcnow
from shared.jobs_repo import MetricRow
from tests.support import kit
from tests.support.dbutil import claimed

SPEC = {**kit.SPEC, "seed": 1}


def _claim_once(
    url: str, worker_id: str, barrier: multiprocessing.synchronize.Barrier, out: multiprocessing.Queue
) -> None:
    db = Database(url)
    barrier.wait()
    with db.session() as session:
        job = jobs_repo.claim_next(session, worker_id=worker_id, lease_s=60)
    out.put((worker_id, job.id if job else None))
    db.dispose()


def test_two_workers_one_job_exactly_one_claim(db_url: str, db: Database) -> None:
    with db.session() as session:
        job = jobs_repo.create_job(session, spec=SPEC)
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    workers = [ctx.Process(target=_claim_once, args=(db_url, f"w{i}", barrier, out)) for i in range(2)]
    for p in workers:
        p.start()
    for p in workers:
        p.join(60)
        assert p.exitcode == 0
    claims = dict(out.get(timeout=5) for _ in workers)

    assert sorted(claims.values(), key=str) == [job.id, None]
    winner = next(w for w, j in claims.items() if j is not None)
    with db.session() as session:
        stored = jobs_repo.get_job(session, job_id=job.id)
    assert stored.status == JobStatus.running
    assert stored.worker_id == winner
    assert stored.attempts == 1


def test_many_workers_drain_the_queue_claiming_each_job_once(db: Database) -> None:
    with db.session() as session:
        ids = [jobs_repo.create_job(session, spec=SPEC).id for _ in range(24)]
    claimed: list[int] = []
    lock = threading.Lock()

    def drain(worker_id: str) -> None:
        database = Database(db.url)
        while True:
            with database.session() as session:
                job = jobs_repo.claim_next(session, worker_id=worker_id, lease_s=60)
            if job is None:
                break
            with lock:
                claimed.append(job.id)
        database.dispose()

    threads = [threading.Thread(target=drain, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    assert sorted(claimed) == ids


def test_claim_order_is_priority_then_age(db: Database) -> None:
    with db.session() as session:
        low = jobs_repo.create_job(session, spec=SPEC, priority=0)
        high = jobs_repo.create_job(session, spec=SPEC, priority=5)
        low2 = jobs_repo.create_job(session, spec=SPEC, priority=0)
        order = [jobs_repo.claim_next(session, worker_id="w", lease_s=60) for _ in range(4)]

    assert [j.id if j else None for j in order] == [high.id, low.id, low2.id, None]


def test_cancelled_jobs_are_never_claimed(db: Database) -> None:
    with db.session() as session:
        job = jobs_repo.create_job(session, spec=SPEC)
        jobs_repo.request_cancel(session, job_id=job.id)

        assert jobs_repo.claim_next(session, worker_id="w", lease_s=60) is None


def test_expired_lease_requeues_then_fails_when_attempts_are_spent(db: Database) -> None:
    with db.session() as session:
        job = jobs_repo.create_job(session, spec=SPEC, max_attempts=2)
        later = utcnow() + timedelta(seconds=120)

        dead = claimed(session, job.id, worker_id="dead-1")
        first = jobs_repo.recover_expired_leases(session, now=later)
        assert jobs_repo.get_job(session, job_id=job.id).status == JobStatus.queued
        # The dead worker's heartbeat and outcome no longer count.
        assert jobs_repo.heartbeat(session, claim=dead, lease_s=60) is None
        assert not jobs_repo.finish_job(session, claim=dead, status=JobStatus.succeeded)

        again = jobs_repo.claim_next(session, worker_id="dead-2", lease_s=60)
        assert again is not None and again.attempts == 2
        second = jobs_repo.recover_expired_leases(session, now=later)
        failed = jobs_repo.get_job(session, job_id=job.id)

    assert [(e.job_id, e.requeued) for e in first + second] == [(job.id, True), (job.id, False)]
    assert failed.status == JobStatus.failed
    assert "all 2 attempts are spent" in (failed.error or "")


def test_live_lease_is_not_recovered(db: Database) -> None:
    with db.session() as session:
        job = jobs_repo.create_job(session, spec=SPEC)
        claim = claimed(session, job.id)

        assert jobs_repo.recover_expired_leases(session) == []
        assert jobs_repo.heartbeat(session, claim=claim, lease_s=60) == JobStatus.running


def test_cancel_of_a_running_job_is_seen_by_its_heartbeat(db: Database) -> None:
    with db.session() as session:
        job = jobs_repo.create_job(session, spec=SPEC)
        claim = claimed(session, job.id)

        assert jobs_repo.request_cancel(session, job_id=job.id).status == JobStatus.cancelling
        assert jobs_repo.heartbeat(session, claim=claim, lease_s=60) == JobStatus.cancelling
        assert jobs_repo.finish_job(session, claim=claim, status=JobStatus.cancelled)
        with pytest.raises(Exception, match="already finished"):
            jobs_repo.request_cancel(session, job_id=job.id)


def test_released_job_keeps_its_attempt(db: Database) -> None:
    with db.session() as session:
        job = jobs_repo.create_job(session, spec=SPEC)
        claim = claimed(session, job.id)

        assert jobs_repo.release_job(session, claim=claim, reason="shutdown")
        released = jobs_repo.get_job(session, job_id=job.id)

    assert (released.status, released.attempts, released.worker_id) == (JobStatus.queued, 0, None)


def test_metric_rows_are_never_duplicated_and_feed_latest_and_best(db: Database) -> None:
    rows_epoch1 = [MetricRow(1.0, 10, "eval", "accuracy", 0.7), MetricRow(1.0, 10, "eval", "loss", 0.6)]
    rows_epoch2 = [MetricRow(2.0, 20, "eval", "accuracy", 0.65), MetricRow(2.0, 20, "eval", "loss", 0.5)]
    with db.session() as session:
        job = jobs_repo.create_job(session, spec=SPEC)
        claim = claimed(session, job.id)
        first = jobs_repo.add_metrics(
            session, job_id=job.id, rows=rows_epoch1, best_metric="accuracy", claim=claim
        )
        # A resumed attempt logs step 10 again: the rows stay single.
        repeat = jobs_repo.add_metrics(
            session, job_id=job.id, rows=rows_epoch1, best_metric="accuracy", claim=claim
        )
        jobs_repo.add_metrics(session, job_id=job.id, rows=rows_epoch2, best_metric="accuracy", claim=claim)
        rows, has_more = jobs_repo.list_metrics(session, job_id=job.id)
        stored = jobs_repo.get_job(session, job_id=job.id)

    assert (first, repeat) == (2, 0)
    assert [(r.step, r.name, r.value) for r in rows] == [
        (10, "accuracy", 0.7),
        (10, "loss", 0.6),
        (20, "accuracy", 0.65),
        (20, "loss", 0.5),
    ]
    assert not has_more
    assert stored.latest_metrics["eval"] == {"accuracy": 0.65, "loss": 0.5, "step": 20, "epoch": 2.0}
    assert stored.best_metrics is not None
    assert (stored.best_metrics["step"], stored.best_metrics["value"]) == (10, 0.7)


def test_metric_cursor_pages_cover_every_row_once(db: Database) -> None:
    with db.session() as session:
        job = jobs_repo.create_job(session, spec=SPEC)
        jobs_repo.add_metrics(
            session,
            job_id=job.id,
            rows=[MetricRow(s / 10, s, "train", "loss", 1 / (s + 1)) for s in range(250)],
            claim=claimed(session, job.id),
        )
        seen, after = [], None
        while True:
            page, has_more = jobs_repo.list_metrics(session, job_id=job.id, after=after, limit=100)
            seen += [r.step for r in page]
            if not has_more:
                break
            after = page[-1].id

    assert seen == list(range(250))


def test_a_cursor_poll_reads_the_owner_and_the_same_pages_as_the_lists_in_one_statement(db: Database) -> None:
    """The API's cursor polls (jobs_repo.cursor_page): the owner and the page in one statement, the
    job's row joined to its page; the pages are list_metrics' and list_events', filters included."""
    with db.session() as session:
        job = jobs_repo.create_job(session, spec=SPEC, owner="alice")
        empty = jobs_repo.create_job(session, spec=SPEC, owner="bob")
        claim = claimed(session, job.id)
        rows = [MetricRow(s / 10, s, ("train", "eval")[s % 2], "loss", 1 / (s + 1)) for s in range(25)]
        jobs_repo.add_metrics(session, job_id=job.id, rows=rows, claim=claim)
        jobs_repo.add_event(session, job_id=job.id, message="hello", data={"a": [1, 2]}, claim=claim)

    def page(table: str, job_id: int, **options: object) -> jobs_repo.CursorPage:
        with db.engine.connect() as connection:
            return jobs_repo.cursor_page(connection, table, job_id=job_id, **options)  # type: ignore[arg-type]

    assert page("metrics", 10**9) == jobs_repo.CursorPage(False, None, [], False)  # no such job
    assert page("metrics", empty.id) == jobs_repo.CursorPage(True, "bob", [], False)
    with db.session() as session:
        listed, more = jobs_repo.list_metrics(session, job_id=job.id, after=None, limit=10)
        evals, _ = jobs_repo.list_metrics(session, job_id=job.id, split="eval", name="loss")
        events, _ = jobs_repo.list_events(session, job_id=job.id)
    first = page("metrics", job.id, limit=10)
    assert (first.found, first.owner, first.has_more) == (True, "alice", more) and more
    assert [(r["id"], r["step"], r["split"]) for r in first.rows] == [(m.id, m.step, m.split) for m in listed]
    rest = page("metrics", job.id, after=first.rows[-1]["id"], limit=100)
    assert [r["step"] for r in first.rows + rest.rows] == list(range(25)) and not rest.has_more
    assert [r["id"] for r in page("metrics", job.id, split="eval", name="loss").rows] == [m.id for m in evals]
    logged = page("events", job.id)
    assert [(r["id"], r["message"], r["data"]) for r in logged.rows] == [
        (e.id, e.message, e.data) for e in events
    ]
    assert logged.rows[-1]["data"] == {"a": [1, 2]}
    with db.engine.connect() as connection:  # the pool's connection back in transactions (Postgres)
        assert connection.get_isolation_level() != "AUTOCOMMIT"


def test_checkpoints_mark_one_best_and_forget_rotated_ones(db: Database) -> None:
    with db.session() as session:
        job = jobs_repo.create_job(session, spec=SPEC)
        claim = claimed(session, job.id)
        for step, value, best in ((10, 1.0, True), (20, 2.0, True), (30, 0.5, False)):
            jobs_repo.add_checkpoint(
                session,
                job_id=job.id,
                step=step,
                epoch=step / 10,
                path=f"/c/{step}",
                metrics={"a": value},
                is_best=best,
                claim=claim,
            )
        jobs_repo.delete_checkpoints(session, job_id=job.id, steps=[10], claim=claim)
        rows = jobs_repo.list_checkpoints(session, job_id=job.id)

    assert [(r.step, r.is_best) for r in rows] == [(20, True), (30, False)]


def test_migrations_create_exactly_the_models_schema(db: Database) -> None:
    with db.engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)

    assert differences == []


def test_a_backoff_that_just_ended_still_counts_as_a_pending_retry(db: Database) -> None:
    """--exit-when-idle waits for a job in its retry backoff, and for one whose backoff ended a moment
    ago (the claim before the end found nothing; the next one takes it), not for one long since due."""
    from shared.core.tables import Job
    from shared.jobs_repo.queue import RETRY_GRACE_S

    with db.session() as session:
        job_id = jobs_repo.create_job(session, spec=SPEC).id
    answers = []
    for offset_s in (30.0, -1.0, -(RETRY_GRACE_S + 5)):
        with db.session() as session, session.begin():
            job = session.get(Job, job_id)
            assert job is not None
            job.not_before = utcnow() + timedelta(seconds=offset_s)
        with db.session() as session:
            answers.append(jobs_repo.retry_pending(session, max_processes=1))
    assert answers == [True, True, False]
