"""Owners: who jobs, sweeps, files and keys belong to, and which owner each configured key names.

An owner is a name (a person or a team). A key made over the API names its owner; a configured
bootstrap key names one with `alice=<key>`, and a configured key without a name belongs to
`key-<first 12 hex digits of its digest>`, a name its holder can compute and that says nothing of
the key. Before owners existed a job's `owner` column held its key's full digest: the migration to
owners (alembic 0008) and every API start (`adopt_configured_owners`) move such rows, and rows of an
unnamed owner, to the name the configuration now gives, so naming or renaming a configured key's
owner later keeps its jobs visible to it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import Connection, Table, delete, select, update
from sqlalchemy.dialects import postgresql, sqlite

from shared.config import Settings, configured_key_digest, split_owner
from shared.models import File, IdempotencyKey, Job, Owner, Sweep

_DIGEST = re.compile(r"[0-9a-f]{64}")
# The tables whose rows belong to an owner through an `owner` column.
OWNED_TABLES: tuple[Table, ...] = tuple(
    model.__table__  # type: ignore[misc]
    for model in (Job, Sweep, File, IdempotencyKey)
)


def unnamed_owner(digest: str) -> str:
    """The owner of a configured key that names none."""
    return f"key-{digest[:12]}"


@dataclass(frozen=True)
class ConfiguredKey:
    digest: str
    owner: str
    is_admin: bool
    named: bool  # the entry gave the owner's name


def configured_keys(settings: Settings) -> list[ConfiguredKey]:
    """The bootstrap keys of the configuration; an entry in both lists is an admin key."""
    keys: dict[str, ConfiguredKey] = {}
    for is_admin, entries in ((False, settings.api_keys), (True, settings.admin_keys)):
        for entry in entries:
            name, _ = split_owner(entry)
            digest = configured_key_digest(entry)
            previous = keys.get(digest)
            owner = name or (previous.owner if previous and previous.named else unnamed_owner(digest))
            keys[digest] = ConfiguredKey(
                digest=digest,
                owner=owner,
                is_admin=is_admin or bool(previous and previous.is_admin),
                named=bool(name) or bool(previous and previous.named),
            )
    return list(keys.values())


def adopt_configured_owners(connection: Connection, keys: Iterable[ConfiguredKey]) -> int:
    """Move rows owned by a configured key's digest (the layout before owners) or by its unnamed
    owner to the owner the configuration names; make every owner's row. Rows moved. Idempotent."""
    moved = 0
    for key in keys:
        old = [key.digest, unnamed_owner(key.digest)]
        old = [name for name in old if name != key.owner]
        _drop_colliding_replays(connection, old, key.owner)
        for table in OWNED_TABLES:
            result = connection.execute(update(table).where(table.c.owner.in_(old)).values(owner=key.owner))
            moved += result.rowcount or 0
        ensure_owner(connection, key.owner)
    return moved


def _drop_colliding_replays(connection: Connection, old: list[str], owner: str) -> None:
    """Two keys now of one owner may each have used the same Idempotency-Key: (owner, key) is unique,
    so the moved copy is dropped (it only replays a create; the jobs themselves all move)."""
    taken = select(IdempotencyKey.key).where(IdempotencyKey.owner == owner).scalar_subquery()
    connection.execute(
        delete(IdempotencyKey).where(IdempotencyKey.owner.in_(old), IdempotencyKey.key.in_(taken))
    )


def name_digest_owners(connection: Connection) -> int:
    """Rows still owned by a bare digest (a key no longer configured) go to its unnamed owner."""
    moved = 0
    for table in OWNED_TABLES:
        digests = {
            owner
            for owner in connection.scalars(select(table.c.owner).distinct())
            if owner and _DIGEST.fullmatch(owner)
        }
        for digest in digests:
            result = connection.execute(
                update(table).where(table.c.owner == digest).values(owner=unnamed_owner(digest))
            )
            moved += result.rowcount or 0
            ensure_owner(connection, unnamed_owner(digest))
    return moved


def ensure_owner(connection: Connection, name: str) -> None:
    """The owner's row (share and quotas live there), made on first use."""
    insert = postgresql.insert if connection.dialect.name == "postgresql" else sqlite.insert
    # Two API processes may start at once: the second one's row is already there.
    connection.execute(insert(Owner).values(name=name, share=1.0).on_conflict_do_nothing())
