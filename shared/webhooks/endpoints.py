"""Webhook endpoints as their owners register, read, change and remove them, and their delivery
logs: each call its own short transaction, owned like jobs (jobs_repo's one ownership check)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from shared.core.db import read, write
from shared.core.errors import Conflict, NotFound
from shared.core.ownership import _newest_first, _owned
from shared.core.tables import WebhookDelivery, WebhookEndpoint, utcnow
from shared.webhooks.events import enqueue_event
from shared.webhooks.signing import new_secret
from shared.wire.vocabulary import TEST_EVENT


def create_endpoint(
    session: Session,
    *,
    owner: str | None,
    url: str,
    event_types: Sequence[str],
    description: str | None = None,
) -> WebhookEndpoint:
    """A new endpoint with a fresh secret (the caller shows it once)."""
    now = utcnow()
    endpoint = WebhookEndpoint(
        owner=owner,
        url=url,
        event_types=list(event_types),
        description=description,
        secret=new_secret(),
        disabled=False,
        created_at=now,
        updated_at=now,
    )
    with write(session):
        session.add(endpoint)
        session.flush()
    return endpoint


def get_endpoint(session: Session, *, endpoint_id: int, owner: str | None = None) -> WebhookEndpoint:
    """The endpoint, or NotFound (also another owner's, when `owner` is set)."""
    with read(session):
        return _endpoint(session, endpoint_id, owner)


def list_endpoints(
    session: Session, *, after: int | None = None, limit: int = 20, owner: str | None = None
) -> tuple[list[WebhookEndpoint], bool]:
    """Newest first; `after` is the id of the last endpoint of the previous page."""
    return _newest_first(
        session, select(WebhookEndpoint), WebhookEndpoint, after=after, limit=limit, owner=owner
    )


def update_endpoint(
    session: Session, *, endpoint_id: int, owner: str | None = None, changes: dict[str, Any]
) -> WebhookEndpoint:
    """Change url, event_types, description and/or disabled (only the keys `changes` holds)."""
    with write(session):
        endpoint = _endpoint(session, endpoint_id, owner, lock=True)
        for name in ("url", "event_types", "description", "disabled"):
            if name in changes:
                setattr(endpoint, name, changes[name])
        endpoint.updated_at = utcnow()
    return endpoint


def delete_endpoint(session: Session, *, endpoint_id: int, owner: str | None = None) -> WebhookEndpoint:
    """Remove the endpoint and its delivery log (pending deliveries are never sent)."""
    with write(session):
        endpoint = _endpoint(session, endpoint_id, owner, lock=True)
        session.delete(endpoint)
    return endpoint


def rotate_secret(session: Session, *, endpoint_id: int, owner: str | None = None) -> WebhookEndpoint:
    """A new secret at once: every delivery from now on, retries included, is signed with it."""
    with write(session):
        endpoint = _endpoint(session, endpoint_id, owner, lock=True)
        endpoint.secret = new_secret()
        endpoint.updated_at = utcnow()
    return endpoint


def send_test(session: Session, *, endpoint_id: int, owner: str | None = None) -> WebhookDelivery:
    """Queue a `webhook.test` event for this endpoint alone, whatever it subscribes to; the delivery,
    which the dispatcher sends like any other. Conflict while the endpoint is disabled (nothing would
    be sent)."""
    with write(session):
        endpoint = _endpoint(session, endpoint_id, owner, lock=True)
        if endpoint.disabled:
            raise Conflict(
                f"webhook {endpoint_id} is disabled: enable it (PATCH disabled=false) to send a test"
            )
        key = f"test:{uuid.uuid4().hex}"
        data = {"endpoint_id": endpoint.id, "message": "a test event from gluejobs"}
        enqueue_event(
            session, owner=endpoint.owner, event_type=TEST_EVENT, data=data, key=key, endpoint_id=endpoint.id
        )
        return session.scalars(
            select(WebhookDelivery).where(
                WebhookDelivery.endpoint_id == endpoint.id, WebhookDelivery.event_key == key
            )
        ).one()


def list_deliveries(
    session: Session,
    *,
    endpoint_id: int,
    owner: str | None = None,
    after: int | None = None,
    limit: int = 20,
) -> tuple[list[WebhookDelivery], bool]:
    """The endpoint's deliveries, newest first; `after` is the id of the last of the previous page."""
    query = (
        select(WebhookDelivery)
        .where(WebhookDelivery.endpoint_id == endpoint_id)
        .order_by(WebhookDelivery.id.desc())
        .limit(limit + 1)
    )
    if after is not None:
        query = query.where(WebhookDelivery.id < after)
    with read(session):
        _endpoint(session, endpoint_id, owner)
        rows = list(session.scalars(query))
    return rows[:limit], len(rows) > limit


def _endpoint(
    session: Session, endpoint_id: int, owner: str | None, *, lock: bool = False
) -> WebhookEndpoint:
    try:
        return _owned(session, WebhookEndpoint, endpoint_id, owner, lock=lock)
    except NotFound:
        raise NotFound(f"webhook {endpoint_id} not found") from None
