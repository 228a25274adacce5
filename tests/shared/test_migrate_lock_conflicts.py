"""A migration run under a working fleet on Postgres (a rolling upgrade) may wait on a worker's
transaction that waits on it: the migration alters several tables one after another, and a job's
transaction writes its row and then its events. Postgres breaks the deadlock by aborting one of the two;
when that is the migration, `upgrade` runs it again (it is one transaction, rolled back whole) instead
of failing `gluejobs migrate`. Seen in test_rolling_upgrade: 0009, which retypes every JSON column,
deadlocked with the previous release's worker finishing a job."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from sqlalchemy import text

from shared import jobs_repo
from shared.core import release
from shared.core.db import Database
from shared.core.migrate import upgrade
from tests.support.dbutil import downgrade
from tests.support.kit import QUICK_JOB

# 0009 takes an exclusive lock on every table with a JSON column, jobs among them.
BEFORE_THE_RETYPE = "0008"


def _held_by_the_migration(db: Database, worker_pid: int) -> tuple[list[str], bool]:
    """The tables the migration holds exclusively, and whether it waits for jobs."""
    with db.engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT c.relname, l.granted FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                "WHERE l.mode = 'AccessExclusiveLock' AND l.pid <> :worker AND c.relkind = 'r' "
                "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ),
            {"worker": worker_pid},
        ).all()
    return [name for name, granted in rows if granted], any(n == "jobs" and not g for n, g in rows)


@pytest.mark.postgres
def test_a_migration_that_deadlocks_with_a_workers_transaction_runs_again_and_lands(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    db = Database(postgres_url)
    with db.session() as session:
        job_id = jobs_repo.create_job(session, spec=QUICK_JOB).id
    downgrade(db, BEFORE_THE_RETYPE)
    worker = db.engine.connect()
    transaction = worker.begin()
    worker_pid = worker.execute(text("SELECT pg_backend_pid()")).scalar_one()
    # The worker's transaction writes its job's row first ...
    worker.execute(text("UPDATE jobs SET status = status WHERE id = :id"), {"id": job_id})

    outcome: list[BaseException | None] = []

    def migrate() -> None:
        try:
            upgrade(db)
            outcome.append(None)
        except BaseException as exc:  # the test reports it
            outcome.append(exc)

    caplog.set_level(logging.WARNING, logger="shared.core.migrate")
    migration = threading.Thread(target=migrate, daemon=True)
    migration.start()
    deadline = time.monotonic() + 30
    held, waits = _held_by_the_migration(db, worker_pid)
    while not (held and waits):  # ... the migration holds a table before jobs and waits for jobs
        assert time.monotonic() < deadline and migration.is_alive(), (held, waits, outcome)
        time.sleep(0.05)
        held, waits = _held_by_the_migration(db, worker_pid)
    # ... then the worker writes to a table the migration holds: each waits on the other. Postgres'
    # deadlock check runs in the session that has waited deadlock_timeout (1 s) first, the migration's,
    # and aborts it; the worker's write goes through.
    worker.execute(text(f'LOCK TABLE "{held[0]}" IN ROW EXCLUSIVE MODE'))
    transaction.commit()
    worker.close()
    migration.join(60)

    assert outcome == [None], outcome
    retries = [r.getMessage() for r in caplog.records if "trying again" in r.getMessage()]
    assert len(retries) == 1 and "DeadlockDetected" in retries[0], retries
    with db.engine.connect() as connection:
        assert release.current_revision(connection) == release.schema_head()
    with db.session() as session:
        assert jobs_repo.get_job(session, job_id=job_id).spec == QUICK_JOB
    db.dispose()
