"""The dispatcher's side of the deliveries table: claim the deliveries that are due under a lease
(several API processes never send one delivery at once), and record each attempt's outcome, fenced
by that lease, with the next attempt after an exponential backoff. All of it is in the database, so
a restart loses nothing: a delivery claimed by a process that stopped is claimed again once its
lease expires. The claim bounds what one endpoint and one owner may have in flight at once, so that
a slow receiver holds up only its own deliveries."""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Select, func, or_, select, text, true, update
from sqlalchemy.orm import Session

from shared.core.db import read, write
from shared.core.tables import DeliveryStatus, WebhookDelivery, WebhookEndpoint, utcnow


@dataclass(frozen=True)
class Due:
    """A delivery claimed for one attempt: what the sender needs, and the lease that fences its result."""

    delivery_id: int
    endpoint_id: int
    owner: str | None
    message_id: str
    url: str
    secret: str
    payload: dict[str, Any]
    attempt: int  # this attempt's number, from 1
    lease_token: str


@dataclass(frozen=True)
class Backoff:
    """When to try again: base_s · 2^(attempt−1), at most cap_s, plus up to 10 % jitter (so that the
    deliveries of one outage do not all come back at once); `max_attempts` in all."""

    max_attempts: int
    base_s: float
    cap_s: float

    def delay_s(self, attempt: int) -> float:
        delay = min(self.cap_s, self.base_s * 2 ** min(attempt - 1, 62))
        return delay * (1 + 0.1 * random.random())


# Names the webhook claim among Postgres advisory locks (an arbitrary constant): claims take it in
# their transaction, one at a time across every API process, so that each sees the others' leases
# and the per-endpoint and per-owner bounds hold for the whole fleet, not per process.
PG_CLAIM_LOCK_ID = 0x676C7565_7768  # "gluewh"


def claim_due(
    session: Session,
    *,
    limit: int,
    lease_s: float,
    per_endpoint: int | None = None,
    per_owner: int | None = None,
    now: datetime | None = None,
) -> list[Due]:
    """Up to `limit` pending deliveries of enabled endpoints whose time has come and which no live
    lease holds, each leased to this caller for `lease_s`; at most `per_endpoint` of one endpoint's
    and `per_owner` of one owner's deliveries are leased at once, counting the live leases every
    process holds (None: no bound). Oldest first within those bounds, so a backlog on one endpoint
    does not hide another endpoint's due delivery.

    Postgres: the claims of all processes take turns (an advisory lock held by the transaction), and
    FOR UPDATE SKIP LOCKED keeps a claim off rows another transaction holds (an older release's
    claim, which does not take the lock); SQLite: its single writer (BEGIN IMMEDIATE) makes the read
    and the update one step."""
    now = now or utcnow()
    token = uuid.uuid4().hex
    chosen = _chosen(now, limit=limit, per_endpoint=per_endpoint, per_owner=per_owner)
    # A plain read first: with nothing that may be sent (the usual case) no write lock is taken, which
    # on SQLite would make every poll wait behind (and hold up) the workers' writes.
    with read(session):
        if not session.scalars(chosen).first():
            return []
    claimed = []
    with write(session):
        if session.get_bind().dialect.name == "postgresql":
            session.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": PG_CLAIM_LOCK_ID})
        ids = list(session.scalars(chosen))
        query = (
            select(WebhookDelivery, WebhookEndpoint)
            .join(WebhookEndpoint, WebhookEndpoint.id == WebhookDelivery.endpoint_id)
            .where(WebhookDelivery.id.in_(ids), *_due(now))
            .order_by(WebhookDelivery.next_attempt_at, WebhookDelivery.id)
            .with_for_update(skip_locked=True, of=WebhookDelivery)
        )
        for delivery, endpoint in session.execute(query).all() if ids else []:
            delivery.lease_token = token
            delivery.lease_expires_at = now + timedelta(seconds=lease_s)
            claimed.append(
                Due(
                    delivery_id=delivery.id,
                    endpoint_id=endpoint.id,
                    owner=endpoint.owner,
                    message_id=delivery.message_id,
                    url=endpoint.url,
                    secret=endpoint.secret,
                    payload=delivery.payload,
                    attempt=delivery.attempts + 1,
                    lease_token=token,
                )
            )
    return claimed


def _due(now: datetime) -> tuple[ColumnElement[bool], ...]:
    """A delivery that may be sent now: pending, its time come, no live lease, its endpoint enabled."""
    return (
        WebhookDelivery.status == DeliveryStatus.pending,
        WebhookDelivery.next_attempt_at <= now,
        or_(WebhookDelivery.lease_expires_at.is_(None), WebhookDelivery.lease_expires_at < now),
        WebhookEndpoint.disabled.is_(False),
    )


def _chosen(now: datetime, *, limit: int, per_endpoint: int | None, per_owner: int | None) -> Select[Any]:
    """The ids of the due deliveries to claim: each endpoint's oldest ones while the endpoint's live
    leases leave room under `per_endpoint`, of those each owner's oldest while the owner's leave room
    under `per_owner`, then the oldest `limit` (window functions: SQLite and Postgres alike)."""
    delivery, endpoint = WebhookDelivery, WebhookEndpoint
    live = (
        delivery.status == DeliveryStatus.pending,
        delivery.lease_expires_at.is_not(None),
        delivery.lease_expires_at >= now,
    )
    busy_endpoints = (
        select(delivery.endpoint_id, func.count().label("busy"))
        .where(*live)
        .group_by(delivery.endpoint_id)
        .subquery()
    )
    busy_owners = (
        select(endpoint.owner, func.count().label("busy"))
        .select_from(delivery)
        .join(endpoint, endpoint.id == delivery.endpoint_id)
        .where(*live)
        .group_by(endpoint.owner)
        .subquery()
    )
    order = (delivery.next_attempt_at, delivery.id)
    lanes = (
        select(
            delivery.id,
            delivery.next_attempt_at,
            endpoint.owner,
            func.row_number().over(partition_by=delivery.endpoint_id, order_by=order).label("rank"),
            func.coalesce(busy_endpoints.c.busy, 0).label("busy"),
        )
        .join(endpoint, endpoint.id == delivery.endpoint_id)
        .outerjoin(busy_endpoints, busy_endpoints.c.endpoint_id == delivery.endpoint_id)
        .where(*_due(now))
        .subquery()
    )
    owners = (
        select(
            lanes.c.id,
            lanes.c.next_attempt_at,
            lanes.c.owner,
            func.row_number()
            .over(partition_by=lanes.c.owner, order_by=(lanes.c.next_attempt_at, lanes.c.id))
            .label("rank"),
        )
        .where(lanes.c.rank + lanes.c.busy <= per_endpoint if per_endpoint is not None else true())
        .subquery()
    )
    owner_busy = func.coalesce(busy_owners.c.busy, 0)
    return (
        select(owners.c.id)
        .outerjoin(busy_owners, busy_owners.c.owner.is_not_distinct_from(owners.c.owner))
        .where(owners.c.rank + owner_busy <= per_owner if per_owner is not None else true())
        .order_by(owners.c.next_attempt_at, owners.c.id)
        .limit(limit)
    )


def record_attempt(
    session: Session,
    *,
    due: Due,
    started_at: datetime,
    status_code: int | None,
    error: str | None,
    duration_ms: int,
    backoff: Backoff,
) -> DeliveryStatus | None:
    """Write one attempt's outcome (2xx: delivered; else another attempt after the backoff, or failed
    once the attempts are spent). None when the lease was lost meanwhile (another process has it)."""
    now = utcnow()
    with write(session):
        delivery = session.scalars(
            select(WebhookDelivery)
            .where(WebhookDelivery.id == due.delivery_id, WebhookDelivery.lease_token == due.lease_token)
            .with_for_update()
        ).one_or_none()
        if delivery is None or delivery.status != DeliveryStatus.pending:
            return None
        ok = error is None and status_code is not None and 200 <= status_code < 300
        entry = {
            "attempt": due.attempt,
            "at": started_at.isoformat(),
            "status_code": status_code,
            "error": error,
            "duration_ms": duration_ms,
        }
        delivery.attempt_log = [*(delivery.attempt_log or []), entry]
        delivery.attempts = due.attempt
        delivery.lease_token, delivery.lease_expires_at = None, None
        if ok:
            delivery.status, delivery.finished_at = DeliveryStatus.delivered, now
        elif due.attempt >= backoff.max_attempts:
            delivery.status, delivery.finished_at = DeliveryStatus.failed, now
        else:
            delivery.next_attempt_at = now + timedelta(seconds=backoff.delay_s(due.attempt))
        return delivery.status


def release(session: Session, *, due: Due) -> None:
    """Hand a claimed delivery back unsent (the API is stopping): the next dispatcher takes it at once."""
    with write(session):
        session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.id == due.delivery_id, WebhookDelivery.lease_token == due.lease_token)
            .values(lease_token=None, lease_expires_at=None)
        )
