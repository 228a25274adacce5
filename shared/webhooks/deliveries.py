"""The dispatcher's side of the deliveries table: claim the deliveries that are due under a lease
(several API processes never send one delivery at once), and record each attempt's outcome, fenced
by that lease, with the next attempt after an exponential backoff. All of it is in the database, so
a restart loses nothing: a delivery claimed by a process that stopped is claimed again once its
lease expires."""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from shared.core.db import read, write
from shared.core.tables import DeliveryStatus, WebhookDelivery, WebhookEndpoint, utcnow


@dataclass(frozen=True)
class Due:
    """A delivery claimed for one attempt: what the sender needs, and the lease that fences its result."""

    delivery_id: int
    endpoint_id: int
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


def claim_due(session: Session, *, limit: int, lease_s: float, now: datetime | None = None) -> list[Due]:
    """Up to `limit` pending deliveries of enabled endpoints whose time has come and which no live
    lease holds, each leased to this caller for `lease_s`. Postgres: FOR UPDATE SKIP LOCKED, so
    concurrent dispatchers take different rows; SQLite: its single writer (BEGIN IMMEDIATE) makes the
    read and the update one step."""
    now = now or utcnow()
    token = uuid.uuid4().hex
    due = (
        WebhookDelivery.status == DeliveryStatus.pending,
        WebhookDelivery.next_attempt_at <= now,
        or_(WebhookDelivery.lease_expires_at.is_(None), WebhookDelivery.lease_expires_at < now),
        WebhookEndpoint.disabled.is_(False),
    )
    joined = (WebhookEndpoint, WebhookEndpoint.id == WebhookDelivery.endpoint_id)
    # A plain read first: with nothing due (the usual case) no write lock is taken, which on SQLite
    # would make every poll wait behind (and hold up) the workers' writes.
    with read(session):
        if session.scalars(select(WebhookDelivery.id).join(*joined).where(*due).limit(1)).first() is None:
            return []
    query = (
        select(WebhookDelivery, WebhookEndpoint)
        .join(*joined)
        .where(*due)
        .order_by(WebhookDelivery.next_attempt_at, WebhookDelivery.id)
        .limit(limit)
        .with_for_update(skip_locked=True, of=WebhookDelivery)
    )
    claimed = []
    with write(session):
        for delivery, endpoint in session.execute(query).all():
            delivery.lease_token = token
            delivery.lease_expires_at = now + timedelta(seconds=lease_s)
            claimed.append(
                Due(
                    delivery_id=delivery.id,
                    endpoint_id=endpoint.id,
                    message_id=delivery.message_id,
                    url=endpoint.url,
                    secret=endpoint.secret,
                    payload=delivery.payload,
                    attempt=delivery.attempts + 1,
                    lease_token=token,
                )
            )
    return claimed


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
