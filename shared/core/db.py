"""Engines and sessions for SQLite (embedded default) and Postgres (a fleet of workers)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.orm import Session, sessionmaker

SQLITE_BUSY_TIMEOUT_S = 30.0
# How long a new Postgres connection may take. Without it, a database host that silently drops
# packets holds each request (and each worker round trip) for the kernel's TCP timeout — minutes —
# instead of answering 503 and retrying. `?connect_timeout=S` in the URL overrides it.
POSTGRES_CONNECT_TIMEOUT_S = 10
# Execution option that asks SQLite for the write lock up front (BEGIN IMMEDIATE), so a write
# transaction waits for the lock instead of failing half-way with "database is locked".
WRITE_OPTION = "gluejobs_write"


def make_engine(url: str, **kwargs: Any) -> Engine:
    # A failed statement's message would quote its parameters: a key's digest, a file's labels, a
    # job's spec. Error messages and logs name the statement only.
    kwargs.setdefault("hide_parameters", True)
    sa_url = make_url(url)
    if sa_url.get_backend_name() == "sqlite":
        return _sqlite_engine(url, **kwargs)
    if sa_url.drivername == "postgresql":
        # psycopg 3 is the driver we install; plain postgresql:// would look for psycopg2.
        sa_url = sa_url.set(drivername="postgresql+psycopg")
    if "connect_timeout" not in sa_url.query:
        kwargs.setdefault("connect_args", {}).setdefault("connect_timeout", POSTGRES_CONNECT_TIMEOUT_S)
    return create_engine(sa_url, pool_pre_ping=True, **kwargs)


def _sqlite_engine(url: str, **kwargs: Any) -> Engine:
    database = make_url(url).database
    if database and database != ":memory:":
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    # `?timeout=S` in the URL sets the busy timeout (how long a writer waits for the lock).
    timeout_s = float(str(make_url(url).query.get("timeout", SQLITE_BUSY_TIMEOUT_S)))
    engine = create_engine(url, connect_args={"timeout": timeout_s}, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, _record: object) -> None:
        # Let SQLAlchemy, not the sqlite3 module, decide where transactions begin (the SQLAlchemy
        # docs' recipe for correct SQLite transactions).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        # WAL: readers (the API) never block the writer (a worker) and the other way round.
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(WRITE_OPTION) else "BEGIN")

    return engine


class Database:
    """An engine and its session factory. Sessions never autobegin: every repository function opens
    its own short transaction, so no route or loop holds one open by accident."""

    def __init__(self, url: str, **engine_kwargs: Any) -> None:
        self.url = url
        self.engine = make_engine(url, **engine_kwargs)
        self.sessionmaker = sessionmaker(self.engine, autobegin=False, expire_on_commit=False)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.sessionmaker() as session:
            yield session

    def dispose(self) -> None:
        self.engine.dispose()


@contextmanager
def read(session: Session) -> Iterator[Session]:
    """A read transaction. Objects come out detached (fully loaded), so the next transaction on the
    same session reads the database afresh instead of a stale identity map."""
    try:
        with session.begin():
            yield session
    finally:
        session.expunge_all()


@contextmanager
def write(session: Session) -> Iterator[Session]:
    """A write transaction (SQLite: BEGIN IMMEDIATE); objects come out detached, as with `read`."""
    try:
        with session.begin():
            session.connection(execution_options={WRITE_OPTION: True})
            yield session
    finally:
        session.expunge_all()
