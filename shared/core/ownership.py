"""What belongs to an owner, read the same way for jobs, sweeps, searches, files, models and webhook
endpoints: one ownership check, one page."""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import Select
from sqlalchemy.orm import Session

from shared.core.db import read
from shared.core.errors import NotFound
from shared.core.tables import File, Job, Search, StoredModel, Sweep, WebhookEndpoint

Owned = TypeVar("Owned", Job, Sweep, File, StoredModel, Search, WebhookEndpoint)


def _owned(
    session: Session, model: type[Owned], row_id: int, owner: str | None, *, lock: bool = False
) -> Owned:
    """The row (locked, with `lock`, inside the caller's write transaction), or NotFound. With
    `owner` set, another key's row is not found either: it does not say that it exists."""
    row = session.get(model, row_id, with_for_update=lock)
    if row is None or (owner is not None and row.owner != owner):
        raise NotFound(f"{model.__name__.lower()} {row_id} not found")
    return row


def _newest_first(
    session: Session,
    query: Select[Any],
    model: type[Owned],
    *,
    after: int | None,
    limit: int,
    owner: str | None,
) -> tuple[list[Owned], bool]:
    """A page of `query`'s rows, newest first, and whether more follow; `after` is the id of the last
    row of the previous page."""
    query = query.order_by(model.id.desc()).limit(limit + 1)
    if after is not None:
        query = query.where(model.id < after)
    if owner is not None:
        query = query.where(model.owner == owner)
    with read(session):
        rows = list(session.scalars(query))
    return rows[:limit], len(rows) > limit
