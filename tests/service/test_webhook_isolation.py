"""One slow webhook receiver holds up nobody else (issue 32 item 3), on SQLite and Postgres: each
attempt ends at one overall deadline however slowly a real receiver on 127.0.0.1 drips its answer,
another owner's delivery goes out while the slow ones are in flight, and the claim bounds what one
endpoint and one owner have in flight at once, across dispatchers, counting live leases (a lease
that lapsed, a process that died mid-attempt, is claimed again)."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.orm import Session

from shared.core.config import Settings
from shared.core.db import Database
from shared.core.tables import WebhookDelivery, WebhookEndpoint, utcnow
from shared.webhooks import endpoints
from shared.webhooks.deliveries import Backoff, claim_due, record_attempt
from tests.support.e2e import live_api, wait_for
from tests.support.webhook_receiver import receiver

FAST = {"webhook_backoff_s": 0.05, "webhook_backoff_max_s": 0.2, "webhook_poll_s": 0.1}
DEADLINE_S = 3.0


def endpoint_of(session: Session, owner: str | None, url: str = "http://x.org/") -> WebhookEndpoint:
    return endpoints.create_endpoint(session, owner=owner, url=url, event_types=["job.failed"])


def all_finished(db: Database, endpoint_ids: list[int], count: int) -> list[WebhookDelivery]:
    """The endpoints' deliveries once `count` of them have finished."""

    def done() -> list[WebhookDelivery] | None:
        with db.session() as session:
            rows = [
                row
                for endpoint_id in endpoint_ids
                for row in endpoints.list_deliveries(session, endpoint_id=endpoint_id, limit=100)[0]
            ]
        return rows if sum(r.status != "pending" for r in rows) >= count else None

    rows: list[WebhookDelivery] = wait_for(done, timeout_s=60, interval_s=0.1)
    return rows


def most_at_once(attempts: list[dict[str, Any]]) -> int:
    """The most attempts in flight at one moment, from the dispatcher's own log (start, duration): an
    attempt's lease is released only after its duration is measured, so the next one starts later."""
    edges = []
    for attempt in attempts:
        start = datetime.fromisoformat(attempt["at"])
        edges += [(start, 1), (start + timedelta(milliseconds=attempt["duration_ms"]), -1)]
    most = current = 0
    for _, step in sorted(edges):  # an end sorts before a start at the same instant
        current += step
        most = max(most, current)
    return most


def test_a_dripping_receiver_delays_only_its_own_deliveries(settings: Settings, db: Database) -> None:
    settings = settings.model_copy(
        update={
            "webhook_allowed_hosts": ["127.0.0.1"],
            "webhook_timeout_s": DEADLINE_S,
            "webhook_max_attempts": 1,
            "webhook_endpoint_concurrency": 2,
            "webhook_owner_concurrency": 3,
            **FAST,
        }
    )
    with (
        receiver(drip="body", drip_s=0.2) as body_drip,
        receiver(drip="headers", drip_s=0.2) as header_drip,
        receiver() as plain,
        live_api(settings),
    ):
        with db.session() as session:
            slow_body, slow_headers, bobs = (
                endpoints.create_endpoint(
                    session, owner=owner, url=f"{hook.url}/", event_types=["job.failed"]
                )
                for owner, hook in (("alice", body_drip), ("alice", header_drip), ("bob", plain))
            )
            for endpoint in (slow_body, slow_headers) * 3:
                endpoints.send_test(session, endpoint_id=endpoint.id)
        # Alice's first attempts are in flight (three: her bound); then Bob's event is queued.
        wait_for(lambda: len(body_drip.requests) + len(header_drip.requests) >= 3, timeout_s=30)
        with db.session() as session:
            endpoints.send_test(session, endpoint_id=bobs.id)
        [bob_request] = wait_for(lambda: plain.requests, timeout_s=30, interval_s=0.02)
        first_alice = min(r.at for r in body_drip.requests + header_drip.requests)
        # Bob's went out while Alice's first attempts were still held open by their receivers.
        assert bob_request.at < first_alice + DEADLINE_S
        rows = all_finished(db, [slow_body.id, slow_headers.id], count=6)

    body_rows = [r for r in rows if r.endpoint_id == slow_body.id]
    header_rows = [r for r in rows if r.endpoint_id == slow_headers.id]
    # Headers that never end: a timed-out attempt. A 200 whose body drips: delivered (the status
    # line decides), the body cut at the deadline. Each ended at the deadline, not the receiver's end.
    for row in header_rows:
        [attempt] = row.attempt_log
        assert row.status == "failed" and attempt["status_code"] is None
        assert attempt["error"] == "no answer within 3s (connect, headers and body together)"
    for row in body_rows:
        [attempt] = row.attempt_log
        assert row.status == "delivered" and attempt["status_code"] == 200 and attempt["error"] is None
    for row in rows:
        assert DEADLINE_S * 1000 - 100 <= row.attempt_log[0]["duration_ms"] < DEADLINE_S * 1000 + 3000
    # Each receiver saw the sender hang up; at most 2 of an endpoint's and 3 of Alice's at once.
    assert all(r.ended_at is not None for r in body_drip.requests + header_drip.requests)
    assert most_at_once([r.attempt_log[0] for r in body_rows]) <= 2
    assert most_at_once([r.attempt_log[0] for r in header_rows]) <= 2
    assert most_at_once([r.attempt_log[0] for r in rows]) == 3


def test_the_claim_bounds_each_endpoint_and_owner_by_their_live_leases(db: Database) -> None:
    with db.session() as session:
        a1, a2, b1 = (endpoint_of(session, owner) for owner in ("alice", "alice", "bob"))
        for endpoint in (a1, a2) * 5 + (b1,):
            endpoints.send_test(session, endpoint_id=endpoint.id)

        def claim(now: datetime | None = None) -> list[Any]:
            return claim_due(session, limit=10, lease_s=30, per_endpoint=2, per_owner=3, now=now)

        first = claim()
        # Alice's three oldest (two of one endpoint, one of the other), Bob's one, though 10 were asked.
        assert Counter(d.owner for d in first) == {"alice": 3, "bob": 1}
        assert max(Counter(d.endpoint_id for d in first).values()) == 2
        assert claim() == []  # her leases are live: nothing more of hers, and Bob has none left
        # One attempt ends (its lease is released): one more of Alice's, from an endpoint with room.
        done = next(d for d in first if d.owner == "alice")
        slow = Backoff(max_attempts=5, base_s=60, cap_s=60)
        outcome = record_attempt(
            session,
            due=done,
            started_at=utcnow(),
            status_code=204,
            error=None,
            duration_ms=5,
            backoff=slow,
        )
        assert outcome == "delivered"
        [another] = claim()
        assert another.owner == "alice" and another.delivery_id not in {d.delivery_id for d in first}
        # A dispatcher that died mid-attempt: once its leases lapse they neither count nor hold their
        # deliveries, which are claimed again (the crashed attempts are retried).
        later = utcnow() + timedelta(seconds=31)
        again = claim(now=later)
        assert Counter(d.owner for d in again) == {"alice": 3, "bob": 1}
        retried = {d.delivery_id for d in first if d is not done} | {another.delivery_id}
        assert {d.delivery_id for d in again} <= retried
        assert all(d.attempt == 1 for d in again)


def test_concurrent_dispatchers_keep_the_bounds_between_them(db: Database) -> None:
    """Four claims at once (four API processes) over 24 due deliveries of three endpoints of one
    owner: between them at most two of each endpoint and four of the owner, none twice."""
    with db.session() as session:
        made = [endpoint_of(session, "carol") for _ in range(3)]
        for endpoint in made * 8:
            endpoints.send_test(session, endpoint_id=endpoint.id)

    def claim() -> list[tuple[int, int]]:
        with db.session() as session:
            claimed = claim_due(session, limit=8, lease_s=30, per_endpoint=2, per_owner=4)
            return [(d.delivery_id, d.endpoint_id) for d in claimed]

    with ThreadPoolExecutor(4) as pool:
        taken = [pair for claimed in pool.map(lambda _: claim(), range(4)) for pair in claimed]
    assert len(taken) == len({delivery for delivery, _ in taken}) == 4
    assert max(Counter(endpoint for _, endpoint in taken).values()) <= 2


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_without_bounds_the_claim_takes_every_due_delivery(db: Database) -> None:
    with db.session() as session:
        endpoint = endpoints.create_endpoint(
            session, owner=None, url="http://x.org/", event_types=["job.failed"]
        )
        for _ in range(5):
            endpoints.send_test(session, endpoint_id=endpoint.id)
        assert len(claim_due(session, limit=10, lease_s=30)) == 5
