"""Taking a database away, as an outage does: the benchmarks' bad days and the tests' share one way.

Postgres refuses new connections (ALTER DATABASE … ALLOW_CONNECTIONS false) and every open session of
the database is terminated, so a pooled connection fails as it would when the server goes away.
SQLite's write lock is held (BEGIN IMMEDIATE) past the busy timeout, which is how an SQLite database
is "away" for a writer. Reads of SQLite still work; that is SQLite's nature, not a gap of the tool.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, make_url, text
from sqlalchemy.engine import Engine


class DatabaseOutage:
    """One database's outages, begun and ended as often as needed; `close` ends any and lets go.

    `admin_url` is a Postgres URL with the right to alter the database (its server's `postgres`
    database, say); it is unused for SQLite.
    """

    def __init__(self, db_url: str, admin_url: str | None = None) -> None:
        self.url = make_url(db_url)
        self.admin: Engine | None = None
        if self.url.get_backend_name() == "postgresql":
            if admin_url is None:
                raise ValueError("a Postgres outage needs an admin URL to alter the database with")
            self.admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
        self._holder: sqlite3.Connection | None = None

    def begin(self) -> None:
        if self.admin is not None:
            with self.admin.connect() as conn:
                conn.execute(text(f'ALTER DATABASE "{self.url.database}" ALLOW_CONNECTIONS false'))
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = :n AND pid <> pg_backend_pid()"
                    ),
                    {"n": self.url.database},
                )
        elif self._holder is None:
            self._holder = sqlite3.connect(str(self.url.database), isolation_level=None)
            self._holder.execute("BEGIN IMMEDIATE")

    def end(self) -> None:
        if self.admin is not None:
            with self.admin.connect() as conn:
                conn.execute(text(f'ALTER DATABASE "{self.url.database}" ALLOW_CONNECTIONS true'))
        elif self._holder is not None:
            self._holder.execute("ROLLBACK")
            self._holder.close()
            self._holder = None

    def close(self) -> None:
        self.end()
        if self.admin is not None:
            self.admin.dispose()

    @contextmanager
    def during(self) -> Iterator[None]:
        """The database is away inside the block, back after it (also when the block raises)."""
        self.begin()
        try:
            yield
        finally:
            self.end()


@contextmanager
def outage(db_url: str, admin_url: str | None = None) -> Iterator[None]:
    """A single outage for the length of the block."""
    away = DatabaseOutage(db_url, admin_url)
    try:
        with away.during():
            yield
    finally:
        away.close()
