"""Keys made over the API: made, listed, rotated and revoked by admins; stored only as digests.

A secret is `gj_` and 43 URL-safe random characters (256 bits from `secrets`), shown once when the
key is made. What is kept is its SHA-256 digest (a presented key is hashed the same way, so the
lookup is by digest and a stored digest cannot be presented as a key), its first characters (the
prefix, to tell keys apart in a list) and who it belongs to. Every lookup reads the row, so a
revocation or an expiry holds on the next request on every API process.
"""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.accounts import audit
from shared.core.config import secret_digest
from shared.core.db import read, write
from shared.core.errors import Conflict, NotFound
from shared.core.owners import ensure_owner
from shared.core.tables import ApiKey, KeyRole, utcnow

SECRET_PREFIX = "gj_"
PREFIX_CHARS = 10
# last_used_at is written at most this often per key: a read-only request costs no write.
LAST_USED_RESOLUTION = timedelta(seconds=60)


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def create_key(
    session: Session,
    *,
    owner: str,
    role: KeyRole,
    name: str,
    expires_at: datetime | None,
    actor: str | None,
    actor_key_id: int | None = None,
    rotated_from: int | None = None,
) -> tuple[ApiKey, str]:
    """A new key and its secret (returned once, never stored), with its audit entry."""
    with write(session):
        return _insert_key(
            session,
            owner=owner,
            role=role,
            name=name,
            expires_at=expires_at,
            actor=actor,
            actor_key_id=actor_key_id,
            rotated_from=rotated_from,
        )


def _insert_key(
    session: Session,
    *,
    owner: str,
    role: KeyRole,
    name: str,
    expires_at: datetime | None,
    actor: str | None,
    actor_key_id: int | None,
    rotated_from: int | None,
) -> tuple[ApiKey, str]:
    """The key's row and its audit entry, inside the caller's write transaction."""
    secret = new_secret()
    ensure_owner(session.connection(), owner)
    key = ApiKey(
        name=name,
        owner=owner,
        role=role,
        prefix=secret[:PREFIX_CHARS],
        digest=secret_digest(secret),
        created_by=actor,
        expires_at=expires_at,
        rotated_from=rotated_from,
    )
    session.add(key)
    session.flush()
    audit.record(
        session,
        actor=actor,
        actor_key_id=actor_key_id,
        action="key.rotate" if rotated_from else "key.create",
        target=f"key {key.id}",
        data={
            "owner": owner,
            "role": str(role),
            "name": name,
            "prefix": key.prefix,
            "expires_at": expires_at.isoformat() if expires_at else None,
            **({"replaces": rotated_from} if rotated_from else {}),
        },
    )
    return key, secret


def list_keys(session: Session, *, owner: str | None = None, include_revoked: bool = False) -> list[ApiKey]:
    query = select(ApiKey).order_by(ApiKey.id)
    if owner is not None:
        query = query.where(ApiKey.owner == owner)
    if not include_revoked:
        query = query.where(ApiKey.revoked_at.is_(None))
    with read(session):
        return list(session.scalars(query))


def revoke_key(
    session: Session, *, key_id: int, actor: str | None, actor_key_id: int | None = None
) -> ApiKey:
    """Revoke a key (the next request with it gets 401, on every API process)."""
    with write(session):
        return _revoke(session, key_id=key_id, actor=actor, actor_key_id=actor_key_id)


def _revoke(session: Session, *, key_id: int, actor: str | None, actor_key_id: int | None) -> ApiKey:
    key = session.get(ApiKey, key_id, with_for_update=True)
    if key is None:
        raise NotFound(f"key {key_id} not found")
    if key.revoked_at is not None:
        raise Conflict(f"key {key_id} was revoked at {key.revoked_at.isoformat()}")
    key.revoked_at = utcnow()
    audit.record(
        session,
        actor=actor,
        actor_key_id=actor_key_id,
        action="key.revoke",
        target=f"key {key.id}",
        data={"owner": key.owner, "name": key.name, "prefix": key.prefix},
    )
    return key


def rotate_key(
    session: Session, *, key_id: int, actor: str | None, actor_key_id: int | None = None
) -> tuple[ApiKey, str]:
    """A new key for the same owner, role, name and expiry; the old one is revoked in the same
    transaction, so a failed rotation leaves the old key working."""
    with write(session):
        old = _revoke(session, key_id=key_id, actor=actor, actor_key_id=actor_key_id)
        return _insert_key(
            session,
            owner=old.owner,
            role=KeyRole(old.role),
            name=old.name,
            expires_at=old.expires_at,
            actor=actor,
            actor_key_id=actor_key_id,
            rotated_from=old.id,
        )


def find_live_key(session: Session, digest: str) -> ApiKey | None:
    """The usable stored key with this digest (not revoked, not expired), or None. Marks it used."""
    now = utcnow()
    with read(session):
        key = session.scalars(select(ApiKey).where(ApiKey.digest == digest)).first()
    if key is None or key.revoked_at is not None or (key.expires_at is not None and key.expires_at <= now):
        return None
    if key.last_used_at is None or now - key.last_used_at >= LAST_USED_RESOLUTION:
        with write(session):
            session.execute(update(ApiKey).where(ApiKey.id == key.id).values(last_used_at=now))
        key.last_used_at = now
    return key


def any_stored_keys(session: Session) -> bool:
    """Whether any key was ever made over the API, revoked ones included: revoking every key must
    not open the API to anonymous callers at the next start (configure a bootstrap key instead)."""
    with read(session):
        return session.scalars(select(ApiKey.id).limit(1)).first() is not None
