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

from shared.core.config import OWNER_NAME, Settings, configured_key_digest, split_owner
from shared.core.tables import ApiKey, File, IdempotencyKey, Job, Owner, Sweep

_DIGEST = re.compile(r"[0-9a-f]{64}")
# The tables whose rows belong to an owner through an `owner` column.
OWNED_TABLES: tuple[Table, ...] = tuple(
    model.__table__  # type: ignore[misc]
    for model in (Job, Sweep, File, IdempotencyKey)
)


# Names the service derives and moves rows from (adopt_configured_owners): `key-<12 hex>` for a
# configured key that names no owner, and a bare digest (the layout before owners). A key made over
# the API, or an owner made by PATCH /v1/owners, may not take such a name: its rows would be handed to
# a configured key's owner at the next start.
RESERVED_PREFIX = "key-"
# The rule as a JSON schema says it (OpenAPI), for clients and fuzzers; the reserved names aside.
OWNER_NAME_SCHEMA: dict[str, str | int] = {
    "type": "string",
    "pattern": f"^{OWNER_NAME.pattern}$",
    "minLength": 1,
    "maxLength": 64,
}
OWNER_NAME_RULE = (
    "an owner's name is 1 to 64 ASCII letters, digits, '.', '_' or '-', starting with a letter or digit"
)


def is_reserved_owner_name(name: str) -> bool:
    """Whether `name` is of the kind the service derives for configured keys."""
    lowered = name.lower()
    return lowered.startswith(RESERVED_PREFIX) or bool(_DIGEST.fullmatch(lowered))


def valid_owner_name(name: str, *, new: bool = False) -> str:
    """`name` if it may name an owner, else ValueError saying why: the one rule of every route that
    takes an owner's name. `new`: the name is being given to someone (a key made, an owner made), so
    the names the service derives for configured keys are refused too."""
    if not OWNER_NAME.fullmatch(name):
        raise ValueError(OWNER_NAME_RULE)
    if new and is_reserved_owner_name(name):
        raise ValueError(
            f"names starting with {RESERVED_PREFIX!r}, and 64-hex-digit names, are the service's own "
            "(the owners of configured keys that name none)"
        )
    return name


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
        # A stored key's owner is a person's, never a configured key's, whatever its name (a key made
        # before such names were refused): its rows stay where they are.
        stored = set(connection.scalars(select(ApiKey.owner).where(ApiKey.owner.in_(old))))
        old = [name for name in old if name != key.owner and name not in stored]
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
