"""Bring a database to this release's schema; run by `gluejobs migrate`, and by `gluejobs serve` and
`gluejobs worker` on start-up (unless --no-migrate).

Several processes may start at once (an API and its workers), so the upgrade runs under a lock:
a Postgres advisory lock, or a lock file beside the SQLite database. A schema newer than this release
knows is left alone: whether this release may work on it is shared/core/release.py's question.
"""

from __future__ import annotations

import fcntl
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, make_url, text

from shared.core import release
from shared.core.db import WRITE_OPTION, Database
from shared.core.db_retries import Backoff, is_lock_conflict
from shared.core.release import alembic_config, migrations_dir

if TYPE_CHECKING:
    from alembic.config import Config

logger = logging.getLogger(__name__)

__all__ = ["alembic_config", "migrations_dir", "upgrade"]

# An arbitrary constant that names gluejobs' migration lock among Postgres advisory locks.
PG_MIGRATION_LOCK_ID = 0x6A0B5
# A migration that alters several tables takes their locks one after another, while a running worker's
# transaction takes them in its own order (a job's row, then its event or checkpoint): the two can wait
# on each other, and Postgres then aborts one of them. When that is the migration, the whole upgrade was
# rolled back (it is one transaction) and is run again, this many times at most; the worker's write went
# through meanwhile. Seen in a rolling upgrade under a running job.
UPGRADE_TRIES = 5


def upgrade(db: Database, revision: str = "head") -> None:
    """Migrate to `revision` (default: this release's head) and record which releases may work on the
    schema; raises release.ReleaseMismatch when this release does not fit the database afterwards."""
    config = alembic_config()
    head = release.schema_head()
    target = head if revision == "head" else revision
    backoff = Backoff(base_s=0.5)  # between attempts that lost a lock conflict (UPGRADE_TRIES)
    # A write transaction from its first statement (SQLite: BEGIN IMMEDIATE): one that read first
    # could not take the write lock once a worker had written meanwhile ("database is locked" at once,
    # whatever the busy timeout), which stopped an API restarted beside busy SQLite workers.
    for attempt in range(1, UPGRADE_TRIES + 1):
        try:
            with _migration_lock(db), db.engine.connect() as connection:
                connection.execution_options(**{WRITE_OPTION: True})
                with connection.begin():
                    _upgrade(connection, config, db.dialect, head, target)
            return
        except Exception as exc:
            if attempt == UPGRADE_TRIES or not is_lock_conflict(exc):
                raise
            logger.warning(
                "the migration waited on a running transaction that waited on it (%s): rolled back, "
                "trying again (%d of %d)",
                type(getattr(exc, "orig", exc)).__name__,
                attempt + 1,
                UPGRADE_TRIES,
            )
            time.sleep(backoff.next_delay())


def _upgrade(connection: Connection, config: Config, dialect: str, head: str, target: str) -> None:
    if dialect == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": PG_MIGRATION_LOCK_ID})
    current = release.current_revision(connection)
    changed = release.changed_migrations(connection, current, head) if current is not None else []
    if changed:  # checked before the upgrade, whose record would write this build's hashes over them
        raise release.ReleaseMismatch(release.changed_line(changed))
    if current is not None and current not in release.known_revisions(head):
        release.check(connection)  # a newer schema: it says whether this release may go on
        return
    if current != target:  # at its target already (every restart): no MigrationContext, no log lines
        from alembic import command  # imported here: see release.alembic_config

        config.attributes["connection"] = connection
        command.upgrade(config, target)
    if target == head:
        release.record(connection, head)
        release.check(connection)


def is_migrating(db: Database) -> bool:
    """Whether another process holds the migration lock now (it is upgrading the schema)."""
    database = make_url(db.url).database
    if db.dialect == "postgresql":
        with db.engine.connect() as connection:
            held = connection.execute(
                text("SELECT pg_try_advisory_xact_lock(:id)"), {"id": PG_MIGRATION_LOCK_ID}
            ).scalar()
            connection.rollback()
        return not held
    if db.dialect != "sqlite" or not database or database == ":memory:":
        return False
    lock_path = Path(database + ".migrate.lock")
    if not lock_path.exists():
        return False
    with lock_path.open("a") as lock_file:
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(lock_file, fcntl.LOCK_UN)
        return False


@contextmanager
def _migration_lock(db: Database) -> Iterator[None]:
    database = make_url(db.url).database
    if db.dialect != "sqlite" or not database or database == ":memory:":
        yield
        return
    lock_path = Path(database + ".migrate.lock")
    with lock_path.open("w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)
