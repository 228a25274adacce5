"""`client.webhooks`, sync and async: an owner's webhook endpoints, each request built once, below,
and sent through the client's I/O (resources/_transport.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from gluejobs._core import Call, query
from gluejobs._types import Webhook, WebhookDelivery
from gluejobs.resources._transport import AsyncTransport, SyncTransport


def _create(url: str, event_types: Sequence[str], description: str | None) -> Call:
    body = {"url": url, "event_types": list(event_types), **query(description=description)}
    # Not sent again after a failure that may have reached the server: it would register it twice.
    return Call("POST", "/v1/webhooks", json=body, idempotent=False)


def _update(webhook_id: int, changes: dict[str, Any]) -> Call:
    unknown = set(changes) - {"url", "event_types", "description", "disabled"}
    if unknown:
        raise TypeError(
            f"unknown webhook field(s) {sorted(unknown)}; expected url, event_types, description, disabled"
        )
    return Call("PATCH", f"/v1/webhooks/{webhook_id}", json=changes)


def _list(page_size: int) -> Call:
    return Call("GET", "/v1/webhooks", params={"limit": page_size})


def _deliveries(webhook_id: int, page_size: int) -> Call:
    return Call("GET", f"/v1/webhooks/{webhook_id}/deliveries", params={"limit": page_size})


def _get(webhook_id: int) -> Call:
    return Call("GET", f"/v1/webhooks/{webhook_id}")


def _delete(webhook_id: int) -> Call:
    # Not sent again after a failure that may have reached the server: a repeat would answer 404.
    return Call("DELETE", f"/v1/webhooks/{webhook_id}", idempotent=False)


def _rotate(webhook_id: int) -> Call:
    # Not sent again: a repeat would make a second secret, and the first answer's would be lost.
    return Call("POST", f"/v1/webhooks/{webhook_id}/rotate", idempotent=False)


def _test(webhook_id: int) -> Call:
    # Not sent again: a repeat would send the endpoint a second test event.
    return Call("POST", f"/v1/webhooks/{webhook_id}/test", idempotent=False)


class Webhooks:
    """`client.webhooks`: register endpoints for job, checkpoint, sweep and search events, and read
    what was sent to them."""

    def __init__(self, client: SyncTransport) -> None:
        self._c = client

    def create(self, url: str, *, event_types: Sequence[str], description: str | None = None) -> Webhook:
        """Register `url` for `event_types`; the answer's `secret` (shown only here) verifies signatures."""
        return self._c._one(_create(url, event_types, description), Webhook)

    def list(self, *, page_size: int = 100) -> Iterator[Webhook]:
        return self._c._paginate(_list(page_size), Webhook.from_json)

    def get(self, webhook_id: int) -> Webhook:
        return self._c._one(_get(webhook_id), Webhook)

    def update(self, webhook_id: int, **changes: Any) -> Webhook:
        """Change url, event_types, description or disabled (True: send nothing until enabled again)."""
        return self._c._one(_update(webhook_id, changes), Webhook)

    def delete(self, webhook_id: int) -> Webhook:
        return self._c._one(_delete(webhook_id), Webhook)

    def rotate(self, webhook_id: int) -> Webhook:
        """A new secret (in this answer only); every delivery from now on is signed with it."""
        return self._c._one(_rotate(webhook_id), Webhook)

    def test(self, webhook_id: int) -> WebhookDelivery:
        """Send a `webhook.test` event now; its delivery (see `deliveries` for how it went)."""
        return self._c._one(_test(webhook_id), WebhookDelivery)

    def deliveries(self, webhook_id: int, *, page_size: int = 100) -> Iterator[WebhookDelivery]:
        """The endpoint's deliveries, newest first, each with its attempts."""
        return self._c._paginate(_deliveries(webhook_id, page_size), WebhookDelivery.from_json)


class AsyncWebhooks:
    """`client.webhooks` of AsyncClient: Webhooks' methods, awaited."""

    def __init__(self, client: AsyncTransport) -> None:
        self._c = client

    async def create(
        self, url: str, *, event_types: Sequence[str], description: str | None = None
    ) -> Webhook:
        return await self._c._one(_create(url, event_types, description), Webhook)

    def list(self, *, page_size: int = 100) -> AsyncIterator[Webhook]:
        return self._c._paginate(_list(page_size), Webhook.from_json)

    async def get(self, webhook_id: int) -> Webhook:
        return await self._c._one(_get(webhook_id), Webhook)

    async def update(self, webhook_id: int, **changes: Any) -> Webhook:
        return await self._c._one(_update(webhook_id, changes), Webhook)

    async def delete(self, webhook_id: int) -> Webhook:
        return await self._c._one(_delete(webhook_id), Webhook)

    async def rotate(self, webhook_id: int) -> Webhook:
        return await self._c._one(_rotate(webhook_id), Webhook)

    async def test(self, webhook_id: int) -> WebhookDelivery:
        return await self._c._one(_test(webhook_id), WebhookDelivery)

    def deliveries(self, webhook_id: int, *, page_size: int = 100) -> AsyncIterator[WebhookDelivery]:
        return self._c._paginate(_deliveries(webhook_id, page_size), WebhookDelivery.from_json)
