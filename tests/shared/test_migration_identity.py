"""A migration is known by its content, not only its id (issue 35 item 1): a database migrated by a
build whose 0013 was another migration before a merge renumbered them read as up to date, and its
webhooks' tables were missing. `gluejobs migrate` records each migration's hash; a build whose
migration of the same id differs refuses with one line naming it; and migrate, serve and worker
verify every table and column their models declare before they work."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from shared.core import release
from shared.core.db import Database
from shared.core.migrate import upgrade


def _digests(db: Database) -> dict[str, str]:
    with db.engine.connect() as connection:
        value = connection.execute(text("SELECT migration_digests FROM gluejobs_release")).scalar_one()
    return json.loads(value) if isinstance(value, str) else dict(value)


def _set_digests(db: Database, digests: dict[str, str] | None) -> None:
    with db.engine.begin() as connection:
        connection.execute(
            text("UPDATE gluejobs_release SET migration_digests = :d"),
            {"d": json.dumps(digests) if digests is not None else None},
        )


def misfit(db: Database) -> str | None:
    with db.engine.connect() as connection:
        return release.misfit(connection)


def test_migrate_records_each_migrations_content_and_refuses_a_changed_one(db: Database) -> None:
    ours = release.migration_digests()
    head = release.schema_head()
    assert _digests(db) == ours and set(ours) == release.known_revisions(head)
    assert misfit(db) is None

    # Migrated by a build whose 0012 and 0013 were other migrations (renumbered by a merge since).
    _set_digests(db, {**ours, "0012": "0" * 64, "0013": "1" * 64})
    line = (
        f"the database's migration 0012, 0013 is not gluejobs {release.RELEASE}'s migration of the same id "
        "(its content differs: renumbered or edited since the database was migrated), so its schema "
        "cannot pass for this build's: restore the database from before that migration, or run the "
        "build that migrated it"
    )
    assert misfit(db) == line  # a worker refuses to claim, /readyz says incompatible
    with pytest.raises(release.ReleaseMismatch) as refused:
        upgrade(db)  # `gluejobs migrate` and `serve` refuse, and write nothing over the hashes
    assert str(refused.value) == line
    assert _digests(db)["0012"] == "0" * 64

    # A newer build's migration this build does not have is not this build's business.
    _set_digests(db, {**ours, "0099": "2" * 64})
    assert misfit(db) is None


def test_a_database_whose_revision_row_says_more_than_its_tables_hold_is_refused(db: Database) -> None:
    """The issue's database: at the head's id, migrated before hashes were recorded, no webhooks."""
    with db.engine.begin() as connection:
        connection.execute(text("DROP TABLE webhook_deliveries"))
        connection.execute(text("DROP TABLE webhook_endpoints"))
        connection.execute(text("ALTER TABLE jobs DROP COLUMN reserved_at"))
    _set_digests(db, None)
    line = (
        f"the database says its schema is at {release.schema_head()}, but it lacks webhook_endpoints, "
        "webhook_deliveries, jobs.reserved_at: it was migrated by another build whose migrations differ "
        "(renumbered or edited); restore it from before that migration, or run the build that migrated it"
    )
    with db.engine.connect() as connection, pytest.raises(release.ReleaseMismatch) as refused:
        release.check(connection)  # serve --no-migrate and worker --no-migrate
    assert str(refused.value) == line
    with pytest.raises(release.ReleaseMismatch) as refused:
        upgrade(db)  # gluejobs migrate, serve, worker
    assert str(refused.value) == line
