"""Request and response bodies of /v1/webhooks. An endpoint's secret is in create's and rotate's
answers only."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from shared.core.tables import DeliveryStatus, WebhookDelivery, WebhookEndpoint

EventType = Literal[
    "job.succeeded", "job.failed", "job.cancelled", "sweep.finished", "search.finished", "checkpoint.declared"
]
MAX_URL_CHARS = 2048


def _distinct(types: list[EventType] | None) -> list[EventType] | None:
    return list(dict.fromkeys(types)) if types is not None else None


class WebhookCreate(BaseModel):
    """An endpoint to register: where to send, and which events."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(
        max_length=MAX_URL_CHARS,
        description="http(s) URL the events are POSTed to; loopback, private, link-local and other "
        "non-public addresses are refused unless GLUEJOBS_WEBHOOK_ALLOWED_HOSTS names them",
    )
    event_types: list[EventType] = Field(min_length=1, description="The events to send")
    description: str | None = Field(None, max_length=255, description="A label to tell endpoints apart")

    _event_types = field_validator("event_types")(_distinct)


class WebhookUpdate(BaseModel):
    """What to change: only the fields sent."""

    model_config = ConfigDict(extra="forbid")

    url: str | None = Field(None, max_length=MAX_URL_CHARS, description="A new URL (checked as on create)")
    event_types: list[EventType] | None = Field(None, min_length=1, description="The events to send")
    description: str | None = Field(None, max_length=255)
    disabled: bool | None = Field(None, description="true: send nothing (deliveries wait); false: send again")

    _event_types = field_validator("event_types")(_distinct)


class WebhookPublic(BaseModel):
    """An endpoint as GET shows it: never its secret."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    owner: str | None
    url: str
    event_types: list[str]
    description: str | None
    disabled: bool
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, endpoint: WebhookEndpoint) -> WebhookPublic:
        return cls.model_validate(endpoint)


class WebhookCreated(WebhookPublic):
    """An endpoint just made, or its secret just rotated: the only answers that hold the secret."""

    secret: str = Field(
        description="`whsec_<base64>`: verify each delivery's webhook-signature with it (Standard Webhooks); "
        "shown once, here"
    )

    @classmethod
    def with_secret(cls, endpoint: WebhookEndpoint) -> WebhookCreated:
        return cls.model_validate({**WebhookPublic.of(endpoint).model_dump(), "secret": endpoint.secret})


class DeliveryAttempt(BaseModel):
    attempt: int
    at: datetime = Field(description="When the attempt started")
    status_code: int | None = Field(description="The endpoint's HTTP status; null when none came")
    error: str | None = Field(description="Why the attempt failed (null: delivered)")
    duration_ms: int


class DeliveryPublic(BaseModel):
    """One event for one endpoint, and every attempt to send it."""

    id: int
    endpoint_id: int
    message_id: str = Field(description="The webhook-id header: the same on every attempt (dedupe on it)")
    event_type: str
    status: DeliveryStatus = Field(description="pending, delivered, or failed (attempts spent)")
    attempts: int
    attempt_log: list[DeliveryAttempt] = Field(description="Oldest first")
    next_attempt_at: datetime | None = Field(description="When it is tried next (null once finished)")
    created_at: datetime
    finished_at: datetime | None
    payload: dict[str, Any] = Field(description="The body sent: {type, timestamp, data}")

    @classmethod
    def of(cls, delivery: WebhookDelivery) -> DeliveryPublic:
        pending = delivery.status == DeliveryStatus.pending
        return cls(
            id=delivery.id,
            endpoint_id=delivery.endpoint_id,
            message_id=delivery.message_id,
            event_type=delivery.event_type,
            status=delivery.status,
            attempts=delivery.attempts,
            attempt_log=[DeliveryAttempt.model_validate(entry) for entry in delivery.attempt_log or []],
            next_attempt_at=delivery.next_attempt_at if pending else None,
            created_at=delivery.created_at,
            finished_at=delivery.finished_at,
            payload=delivery.payload,
        )
