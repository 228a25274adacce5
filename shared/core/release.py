"""Which release of gluejobs may work on a database, so that a fleet mid-upgrade fails safe.

The database says two things: its schema revision (Alembic's alembic_version) and, in the one row of
`gluejobs_release`, the oldest release whose API and workers may work on that schema (written by
`gluejobs migrate`, from the migrating release's OLDEST_FITTING_RELEASE). A process fits when

- the schema is this release's head (older: it needs `gluejobs migrate`), or a newer one whose row
  admits this release (a later release whose migrations are additive says so, and older workers go on);
- and this release is not older than the row's oldest fitting release.

An API that does not fit refuses to serve and a worker refuses to claim, each with one line that says
which release or which migration is needed (`ReleaseMismatch`). docs/upgrading.md tells the order.

A revision id alone does not say which migration ran (issue 35: a database migrated by an earlier
commit, whose 0013 was another migration before a merge renumbered them, read as up to date and
lacked the webhooks' tables). So `gluejobs migrate` also records the content hash of every migration
the schema went through (`migration_digests`), and a build whose migration of the same id differs
does not fit; and `gluejobs migrate`, `serve` and `worker` verify on start that every table and
column this build's models declare is there (`check`), which catches a database migrated before the
hashes were recorded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, insert, inspect, text, update

from shared.core.tables import Base, ReleaseRecord, utcnow

if TYPE_CHECKING:
    from alembic.config import Config

# Alembic logs a line at INFO for each of its plugins as it is first imported (seven lines): on a
# process's first migration or schema read, which is now after its logging is set up.
logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)

# The release of this code base: the distributions' version (pyproject.toml, server/pyproject.toml).
RELEASE = "0.2.0"
# The oldest release whose API and workers may work on this release's newest schema. 0.2.0: jobs may
# name models kept in the store, which the workers of 0.1.0 cannot fetch; 0.1.0 predates these checks,
# so its workers are stopped before the migration (docs/upgrading.md).
OLDEST_FITTING_RELEASE = "0.2.0"

TABLE = "gluejobs_release"
# Alembic's table of the schema's revision (its default name, which alembic/env.py keeps).
VERSION_TABLE = "alembic_version"


class ReleaseMismatch(RuntimeError):
    """This release does not fit the database; the message is the one line an operator reads."""


# The repository keeps its migrations in the top-level alembic/ folder; the gluejobs-server wheel
# carries them as shared/migrations (a top-level `alembic` folder would shadow the alembic package).
# This module is shared/core/release.py: shared/ is two folders up, the repository three.
MIGRATION_DIRS = (
    Path(__file__).resolve().parents[1] / "migrations",
    Path(__file__).resolve().parents[2] / "alembic",
)


def migrations_dir() -> Path:
    for folder in MIGRATION_DIRS:
        if (folder / "env.py").is_file():
            return folder
    raise RuntimeError(
        f"gluejobs-server's migrations are missing (looked in {', '.join(map(str, MIGRATION_DIRS))}): "
        "reinstall gluejobs-server"
    )


def alembic_config() -> Config:
    # Alembic is imported where it is used: importing it costs about 0.8 s of CPU (its dialect
    # modules), which an API that serves a migrated database never needs (bench/api_startup.py).
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    return config


def version_key(version: str) -> tuple[int, ...]:
    """ "0.10.2" → (0, 10, 2): releases compare by their numbers (pre-release tags are ignored)."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


# The head and known revisions as a process that read the migrations told this one (`told`).
_told: tuple[str, frozenset[str]] | None = None


def told(head: str, known: frozenset[str]) -> None:
    """What another process of this release read from its migrations: `gluejobs serve` migrates in a
    process of its own while it imports the API (service/server.py), and its /readyz then needs
    neither Alembic nor the migration files."""
    global _told
    _told = (head, known)


def schema_head() -> str:
    """The newest schema revision this release's migrations know."""
    return _told[0] if _told is not None else _schema_head()


@cache
def _schema_head() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def known_revisions(head: str) -> frozenset[str]:
    """The revisions from the first migration up to `head`: the schemas this release has met."""
    if _told is not None and _told[0] == head:
        return _told[1]
    return _known_revisions(head)


@cache
def _known_revisions(head: str) -> frozenset[str]:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config())
    return frozenset(revision.revision for revision in script.iterate_revisions(head, "base"))


def current_revision(connection: Connection) -> str | None:
    """The database's schema revision, or None before any migration. Read from Alembic's table as
    Alembic's MigrationContext.get_current_revision reads it, without making a MigrationContext:
    each of those logs two INFO lines ("Context impl …", "Will assume … DDL"), and a worker asks
    before every claim (issue 35: 702 of a worker's 740 log lines)."""
    if not inspect(connection).has_table(VERSION_TABLE):
        return None
    heads = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    if len(heads) > 1:  # a branched history, which gluejobs' linear migrations never make
        raise ReleaseMismatch(
            f"the database's schema has {len(heads)} revisions at once ({', '.join(heads)}): "
            "run `gluejobs migrate`"
        )
    return str(heads[0]) if heads else None


# The migration that added gluejobs_release.migration_digests: a schema before it has no hashes.
DIGESTS_SINCE = "0014"
_REVISION = re.compile(r"^revision(?:\s*:\s*str)?\s*=\s*[\"']([^\"']+)[\"']", re.MULTILINE)
_DOWN = re.compile(r"^down_revision(?:\s*:[^=]*)?=\s*[\"']([^\"']+)[\"']", re.MULTILINE)


@cache
def migration_files() -> tuple[tuple[str, str | None, str], ...]:
    """(revision, down revision, sha256 of the file) of each of this build's migrations, read from
    the files as they are (no Alembic import: the API never imports it; see alembic_config)."""
    found = []
    for path in sorted((migrations_dir() / "versions").glob("*.py")):
        content = path.read_bytes()
        revision = _REVISION.search(content.decode())
        if revision is None:
            continue
        down = _DOWN.search(content.decode())
        found.append(
            (revision.group(1), down.group(1) if down else None, hashlib.sha256(content).hexdigest())
        )
    return tuple(found)


def migration_digests() -> dict[str, str]:
    """{revision: sha256 of its file} for this build's migrations."""
    return {revision: digest for revision, _, digest in migration_files()}


def files_head() -> str | None:
    """The newest revision among this build's migration files (the one no other revises)."""
    revisions = migration_files()
    downs = {down for _, down, _ in revisions}
    heads = [revision for revision, _, _ in revisions if revision not in downs]
    return heads[0] if len(heads) == 1 else None


def recorded_digests(connection: Connection, current: str, head: str) -> dict[str, str] | None:
    """The migration hashes `gluejobs migrate` recorded, or None where none were (a schema before
    DIGESTS_SINCE, or migrated by a build that did not record them)."""
    known = known_revisions(head)
    if current in known and (DIGESTS_SINCE not in known or DIGESTS_SINCE not in _chain_to(current)):
        return None
    # The table is there: DIGESTS_SINCE (or a newer schema) is past 0010, which made it.
    value = connection.execute(text(f"SELECT migration_digests FROM {TABLE} WHERE id = 1")).scalar()
    if isinstance(value, str):  # SQLite's driver gives JSON as text; psycopg parses it
        value = json.loads(value)
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else None


def _chain_to(revision: str) -> set[str]:
    down = {rev: parent for rev, parent, _ in migration_files()}
    chain = set()
    at: str | None = revision
    while at is not None and at not in chain:
        chain.add(at)
        at = down.get(at)
    return chain


def changed_migrations(connection: Connection, current: str, head: str) -> list[str]:
    """The revisions the database went through whose migration differs from this build's of the same
    id (renumbered or edited since), oldest first."""
    recorded = recorded_digests(connection, current, head)
    if not recorded:
        return []
    ours = migration_digests()
    return sorted(
        revision for revision, digest in recorded.items() if revision in ours and ours[revision] != digest
    )


def changed_line(changed: list[str], release: str = RELEASE) -> str:
    """The one line a build refuses a database with whose migrations `changed` differ from its own."""
    return (
        f"the database's migration {', '.join(changed)} is not gluejobs {release}'s migration of the same "
        "id (its content differs: renumbered or edited since the database was migrated), so its schema "
        "cannot pass for this build's: restore the database from before that migration, or run the "
        "build that migrated it"
    )


def missing_schema(connection: Connection) -> list[str]:
    """Every table and column this build's models declare that the database lacks ("webhook_endpoints",
    "jobs.reserved_by"): one catalogue read per table kind, at start-up only."""
    inspector = inspect(connection)
    tables = set(inspector.get_table_names())
    missing = [name for name in Base.metadata.tables if name not in tables]
    present = [name for name in Base.metadata.tables if name in tables]
    columns = inspector.get_multi_columns(filter_names=present) if present else {}
    found = {table: {column["name"] for column in cols} for (_, table), cols in columns.items()}
    for name in present:
        for column in Base.metadata.tables[name].columns:
            if column.name not in found.get(name, set()):
                missing.append(f"{name}.{column.name}")
    return missing


def oldest_fitting(connection: Connection) -> str | None:
    """The oldest release the database admits, or None when no release has written it (a schema
    migrated by 0.1.0, which predates the row)."""
    if not inspect(connection).has_table(TABLE):
        return None
    value = connection.execute(text(f"SELECT min_release FROM {TABLE} WHERE id = 1")).scalar()
    return str(value) if value is not None else None


def misfit(connection: Connection, release: str | None = None, head: str | None = None) -> str | None:
    """Why this release (default RELEASE, with its schema head) must not work on the database, as
    one line, or None when it fits."""
    release = release or RELEASE
    head = head or schema_head()
    current = current_revision(connection)
    if current is None:
        return f"the database has no gluejobs schema yet: run `gluejobs migrate` (gluejobs {release})"
    oldest = oldest_fitting(connection)
    if current not in known_revisions(head):
        if oldest is None:
            return (
                f"the database's schema {current} is newer than gluejobs {release} knows (its newest is "
                f"{head}): install the release that migrated it"
            )
        if version_key(release) < version_key(oldest):
            return _too_old(release, oldest, current)
        return None  # a newer, additive schema that admits this release
    changed = changed_migrations(connection, current, head)
    if changed:
        return changed_line(changed, release)
    if current != head:
        return (
            f"gluejobs {release} needs the database schema at {head}, and it is at {current}: "
            f"run `gluejobs migrate` with gluejobs {release}"
        )
    if oldest is not None and version_key(release) < version_key(oldest):
        return _too_old(release, oldest, current)
    return None


def _too_old(release: str, oldest: str, current: str) -> str:
    return (
        f"the database (schema {current}) needs gluejobs {oldest} or newer, and this is gluejobs {release}: "
        f"upgrade it (pip install -U gluejobs-server=={oldest} or newer)"
    )


def check(connection: Connection) -> None:
    """Raise ReleaseMismatch unless this release fits the database: its revision and migrations
    (misfit), and, on this build's own head, every table and column its models declare (a database
    whose revision row says more than its tables hold)."""
    reason = misfit(connection)
    if reason is not None:
        raise ReleaseMismatch(reason)
    current = current_revision(connection)
    # Only on the head of this build's files: the models describe that schema (a test's previous
    # release, whose head is older, runs this code on a schema without the later tables).
    if current is not None and current == schema_head() == files_head():
        missing = missing_schema(connection)
        if missing:
            shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
            raise ReleaseMismatch(
                f"the database says its schema is at {current}, but it lacks {shown}: it was migrated by "
                "another build whose migrations differ (renumbered or edited); restore it from before "
                "that migration, or run the build that migrated it"
            )


def record(connection: Connection, head: str) -> None:
    """Written by `gluejobs migrate` once the schema is at this release's head: the oldest release that
    may work on it (never lowered: a newer release's word stands), and which release migrated it."""
    if not inspect(connection).has_table(TABLE):
        return  # a schema before the table (a test's previous head)
    oldest = max(
        OLDEST_FITTING_RELEASE, oldest_fitting(connection) or OLDEST_FITTING_RELEASE, key=version_key
    )
    values: dict[str, object] = {
        "schema_revision": head,
        "min_release": oldest,
        "migrated_by": RELEASE,
        "migrated_at": utcnow(),
    }
    if DIGESTS_SINCE in known_revisions(head):
        chain = known_revisions(head)
        values["migration_digests"] = {
            rev: digest for rev, digest in migration_digests().items() if rev in chain
        }
    if not connection.execute(update(ReleaseRecord).where(ReleaseRecord.id == 1).values(**values)).rowcount:
        connection.execute(insert(ReleaseRecord).values(id=1, **values))
