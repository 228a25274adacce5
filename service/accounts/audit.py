"""The audit log: who changed keys, quotas and shares, and when (GET /v1/audit reads it).

A job's own history — who created, cancelled or reran it — lives in its events instead, beside its
state changes. Entries are written inside the caller's write transaction, so a change and its entry
commit together or not at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from shared.core.db import read
from shared.core.tables import AuditEntry


def record(
    session: Session,
    *,
    actor: str | None,
    action: str,
    target: str,
    actor_key_id: int | None = None,
    data: Mapping[str, Any] | None = None,
) -> AuditEntry:
    """Add an entry to the caller's open write transaction. `data` never holds a secret."""
    entry = AuditEntry(
        actor=actor, actor_key_id=actor_key_id, action=action, target=target, data=dict(data or {})
    )
    session.add(entry)
    return entry


def list_entries(session: Session, *, after: int | None, limit: int) -> tuple[list[AuditEntry], bool]:
    """Entries newest first, `limit` at a time after the cursor `after`; whether more follow."""
    query = select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit + 1)
    if after is not None:
        query = query.where(AuditEntry.id < after)
    with read(session):
        rows = list(session.scalars(query))
    return rows[:limit], len(rows) > limit
