"""Bring a database to the newest schema; run by `gluejobs serve` and `gluejobs worker` on start-up.

Several processes may start at once (an API and its workers), so the upgrade runs under a lock:
a Postgres advisory lock, or a lock file beside the SQLite database.
"""

from __future__ import annotations

import fcntl
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, make_url, text

from shared.db import Database

logger = logging.getLogger(__name__)

ALEMBIC_DIR = Path(__file__).resolve().parent.parent / "alembic"
# An arbitrary constant that names gluejobs' migration lock among Postgres advisory locks.
PG_MIGRATION_LOCK_ID = 0x6A0B5


def alembic_config() -> Config:
    if not (ALEMBIC_DIR / "env.py").is_file():
        raise RuntimeError(
            f"the migrations are not at {ALEMBIC_DIR}: install gluejobs from its source (pip install -e .)"
        )
    config = Config()
    config.set_main_option("script_location", str(ALEMBIC_DIR))
    return config


def upgrade(db: Database, revision: str = "head") -> None:
    config = alembic_config()
    with _migration_lock(db), db.engine.begin() as connection:
        if db.dialect == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": PG_MIGRATION_LOCK_ID})
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def is_up_to_date(connection: Connection) -> bool:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    return MigrationContext.configure(connection).get_current_revision() == head


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
