"""/v1/webhooks: an owner's endpoints, their secrets (shown at create and rotate only), test-sends
and delivery logs. Owned like jobs: another owner's endpoint is a 404; admin keys see all."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, status
from sqlalchemy.orm import Session

from service.deps import After, PrincipalDep, RowId, SessionDep, SettingsDep
from service.schemas.common import ErrorResponse, Page
from service.schemas.webhooks import (
    DeliveryPublic,
    WebhookCreate,
    WebhookCreated,
    WebhookPublic,
    WebhookUpdate,
)
from shared.core.config import Settings
from shared.core.errors import InvalidRequest
from shared.core.tables import WebhookEndpoint
from shared.webhooks import endpoints
from shared.webhooks.addresses import AllowList, RefusedTarget, checked_target

router = APIRouter(prefix="/webhooks", tags=["webhooks"])

WebhookId = Annotated[RowId, Path(description="The webhook endpoint's id")]
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorResponse}}


def _check_url(url: str, settings: Settings) -> None:
    """422 naming the rule when the URL may not be sent to (shared/webhooks/addresses.py)."""
    try:
        checked_target(url, AllowList.parse(settings.webhook_allowed_hosts))
    except RefusedTarget as exc:
        raise InvalidRequest(f"url: {exc}", field="url") from None


@router.post("", status_code=status.HTTP_201_CREATED)
def create_webhook(
    body: WebhookCreate, session: SessionDep, settings: SettingsDep, principal: PrincipalDep
) -> WebhookCreated:
    """Register an endpoint. The answer holds its signing secret, shown this once (rotate for a new one)."""
    _check_url(body.url, settings)
    endpoint = endpoints.create_endpoint(
        session,
        owner=principal.owner,
        url=body.url,
        event_types=body.event_types,
        description=body.description,
    )
    return WebhookCreated.with_secret(endpoint)


@router.get("", response_model=Page[WebhookPublic])
def read_webhooks(
    session: SessionDep,
    principal: PrincipalDep,
    limit: Annotated[int, Query(ge=1, le=100, description="Page size")] = 20,
    after: After = None,
) -> dict[str, Any]:
    """The caller's endpoints (admin keys: everyone's), newest first, in cursor pages."""
    rows, has_more = endpoints.list_endpoints(session, after=after, limit=limit, owner=principal.owner_filter)
    return {
        "data": [WebhookPublic.of(row) for row in rows],
        "has_more": has_more,
        "next_cursor": str(rows[-1].id) if has_more and rows else None,
    }


def _endpoint(session: Session, webhook_id: int, owner: str | None) -> WebhookEndpoint:
    return endpoints.get_endpoint(session, endpoint_id=webhook_id, owner=owner)


@router.get("/{webhook_id}", responses=NOT_FOUND)
def read_webhook(webhook_id: WebhookId, session: SessionDep, principal: PrincipalDep) -> WebhookPublic:
    """The endpoint (never its secret)."""
    return WebhookPublic.of(_endpoint(session, webhook_id, principal.owner_filter))


@router.patch("/{webhook_id}", responses=NOT_FOUND)
def update_webhook(
    webhook_id: WebhookId,
    body: WebhookUpdate,
    session: SessionDep,
    settings: SettingsDep,
    principal: PrincipalDep,
) -> WebhookPublic:
    """Change the URL, the event types, the description, or disable / enable the endpoint."""
    changes = body.model_dump(exclude_unset=True)
    for name in ("url", "event_types", "disabled"):
        if name in changes and changes[name] is None:
            raise InvalidRequest(f"{name} cannot be null", field=name)
    if "url" in changes:
        _check_url(changes["url"], settings)
    endpoint = endpoints.update_endpoint(
        session, endpoint_id=webhook_id, owner=principal.owner_filter, changes=changes
    )
    return WebhookPublic.of(endpoint)


@router.delete("/{webhook_id}", responses=NOT_FOUND)
def delete_webhook(webhook_id: WebhookId, session: SessionDep, principal: PrincipalDep) -> WebhookPublic:
    """Remove the endpoint and its delivery log; its pending deliveries are not sent."""
    return WebhookPublic.of(
        endpoints.delete_endpoint(session, endpoint_id=webhook_id, owner=principal.owner_filter)
    )


@router.post("/{webhook_id}/rotate", status_code=status.HTTP_201_CREATED, responses=NOT_FOUND)
def rotate_webhook_secret(
    webhook_id: WebhookId, session: SessionDep, principal: PrincipalDep
) -> WebhookCreated:
    """A new signing secret, shown this once; every delivery from now on (retries too) is signed with it."""
    return WebhookCreated.with_secret(
        endpoints.rotate_secret(session, endpoint_id=webhook_id, owner=principal.owner_filter)
    )


@router.post(
    "/{webhook_id}/test",
    status_code=status.HTTP_202_ACCEPTED,
    responses={**NOT_FOUND, 409: {"model": ErrorResponse, "description": "The endpoint is disabled"}},
)
def test_webhook(
    webhook_id: WebhookId, request: Request, session: SessionDep, principal: PrincipalDep
) -> DeliveryPublic:
    """Queue a `webhook.test` event for this endpoint; the delivery, sent at once (see its log)."""
    delivery = endpoints.send_test(session, endpoint_id=webhook_id, owner=principal.owner_filter)
    dispatcher = request.app.state.webhooks
    if dispatcher is not None:
        dispatcher.wake()
    return DeliveryPublic.of(delivery)


@router.get("/{webhook_id}/deliveries", response_model=Page[DeliveryPublic], responses=NOT_FOUND)
def read_webhook_deliveries(
    webhook_id: WebhookId,
    session: SessionDep,
    principal: PrincipalDep,
    limit: Annotated[int, Query(ge=1, le=100, description="Page size")] = 20,
    after: After = None,
) -> dict[str, Any]:
    """The endpoint's deliveries, newest first: event, status, and every attempt's status code or error."""
    rows, has_more = endpoints.list_deliveries(
        session, endpoint_id=webhook_id, owner=principal.owner_filter, after=after, limit=limit
    )
    return {
        "data": [DeliveryPublic.of(row) for row in rows],
        "has_more": has_more,
        "next_cursor": str(rows[-1].id) if has_more and rows else None,
    }
