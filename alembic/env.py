"""Alembic environment: migrations run on the connection shared/core/migrate.py hands over (under its
lock), or, from Alembic's own CLI, on GLUEJOBS_DATABASE_URL."""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context

from shared.core.config import get_settings
from shared.core.db import make_engine
from shared.core.tables import Base

config = context.config
if config.config_file_name is not None and not config.attributes.get("connection"):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def run_migrations(connection: object) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things: batch mode rebuilds the table instead.
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    run_migrations(connection)
else:
    engine = make_engine(config.get_main_option("sqlalchemy.url") or get_settings().database_url)
    with engine.connect() as conn:
        run_migrations(conn)
    engine.dispose()
