"""Many streams on one job share one reader per API process (service/background/stream_fanout.py): each of
them still gets every row exactly once, in order, across a database outage and across a reconnection with
Last-Event-ID; a stream whose key is revoked, rotated or expired gets an `error` event and closes;
a Last-Event-ID of non-ASCII digits is refused, not a 500. The API is `python -m service` in a
process of its own; rows are written as a job's process writes them (claimed, fenced). SQLite and
Postgres (on Postgres the rows wake the reader through NOTIFY, and the outage kills the API's LISTEN
connection too)."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from shared import jobs_repo
from shared.core.db import Database
from shared.core.tables import ApiKey, JobStatus, utcnow
from shared.jobs_repo import Claim, MetricRow
from tests.support.dbutil import claimed
from tests.support.e2e import api_process, wait_for
from tests.support.kit import POSTGRES_URL, SPEC
from tests.support.observe_helpers import Sse, read_sse
from tests.support.outages import outage

pytestmark = pytest.mark.e2e

STREAMS = 20
ROOT = "root-admin-key-for-fanout-tests-0001"


class Follower(threading.Thread):
    """One client following the job's stream until it ends (or until `stop_after` rows)."""

    def __init__(self, base_url: str, job_id: int, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(daemon=True)
        self.base_url, self.job_id, self.headers = base_url, job_id, headers or {}
        self.received: list[Sse] = []
        self.errors: list[BaseException] = []
        self.stop_after: int | None = None

    def run(self) -> None:
        try:
            with (
                httpx.Client(base_url=self.base_url, timeout=60) as client,
                client.stream("GET", f"/v1/jobs/{self.job_id}/stream", headers=self.headers) as response,
            ):
                assert response.status_code == 200, response.read()
                for message in read_sse(response):
                    self.received.append(message)
                    if self.stop_after is not None and len(self.rows()) >= self.stop_after:
                        return
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)

    def rows(self) -> list[str]:
        return [m.data["message"] for m in self.received if m.event == "event"]


def write_rows(db: Database, claim: Claim, first: int, count: int) -> None:
    """A metric row and a log event per step, each in its own transaction, as a job's process writes."""
    for n in range(first, first + count):
        with db.session() as session:
            jobs_repo.add_metrics(
                session,
                job_id=claim.job_id,
                rows=[MetricRow(0.1 * n, n, "train", "loss", 1 / n)],
                claim=claim,
            )
            jobs_repo.add_event(session, job_id=claim.job_id, message=f"row {n}", claim=claim)


def test_twenty_streams_on_one_job_get_every_row_once_across_an_outage_and_a_reconnect(
    db_url: str, settings_factory: Any, tmp_path: Path
) -> None:
    sqlite = db_url.startswith("sqlite")
    settings = settings_factory(f"{db_url}?timeout=1" if sqlite else db_url)
    db = Database(db_url)
    log = tmp_path / "api.log"
    with api_process(settings, log=log) as (client, _):
        job = client.post("/v1/jobs", json={"spec": SPEC}).json()
        with db.session() as session:
            claim = claimed(session, job["id"])
        base_url = str(client.base_url)
        followers = [Follower(base_url, job["id"]) for _ in range(STREAMS)]
        leaver = Follower(base_url, job["id"])
        leaver.stop_after = 3  # hangs up after three rows, and comes back later with Last-Event-ID
        for follower in [*followers, leaver]:
            follower.start()
        wait_for(lambda: all(f.received for f in followers), timeout_s=60, interval_s=0.1)

        write_rows(db, claim, 1, 5)
        wait_for(lambda: all(len(f.rows()) == 5 for f in followers), timeout_s=60, interval_s=0.1)
        leaver.join(60)
        assert leaver.rows() == ["row 1", "row 2", "row 3"]

        with outage(db_url, POSTGRES_URL):
            time.sleep(3.0)  # the job's reader meets the outage (Postgres: its LISTEN connection too)
        write_rows(db, claim, 6, 5)
        last_id = next(m.id for m in reversed(leaver.received) if m.id)
        returning = Follower(base_url, job["id"], headers={"Last-Event-ID": last_id or ""})
        returning.start()
        wait_for(lambda: all(len(f.rows()) == 10 for f in followers), timeout_s=60, interval_s=0.1)
        with db.session() as session:
            assert jobs_repo.finish_job(session, claim=claim, status=JobStatus.succeeded)
        for follower in [*followers, returning]:
            follower.join(60)
    db.dispose()

    expected = [f"row {n}" for n in range(1, 11)]
    for follower in [*followers, returning]:
        assert not follower.errors, follower.errors
        assert follower.received[-1].event == "end", follower.received[-3:]
        assert follower.received[-1].data == {"status": "succeeded"}
        ids = [tuple(map(int, m.id.split("."))) for m in follower.received if m.id and m.event != "end"]
        assert len(ids) == len(set(ids)) and ids == sorted(ids)
    for follower in followers:  # every row once, in order, metrics and events alike
        assert follower.rows() == expected
        assert [m.data["step"] for m in follower.received if m.event == "metric"] == list(range(1, 11))
        statuses = [m.data["status"] for m in follower.received if m.event == "status"]
        assert statuses == ["queued", "running", "succeeded"]
    # The stream that left and came back: together, exactly what the others got.
    together = leaver.received + returning.received
    assert [m.data["message"] for m in together if m.event == "event"] == expected
    assert [m.data["step"] for m in together if m.event == "metric"] == list(range(1, 11))
    # No reader failed. The one error FastAPI itself may log is its SSE keep-alive task meeting a
    # client that hung up (anyio.BrokenResourceError; fastapi/fastapi discussion 15725): the leaver.
    text = log.read_text()
    assert "stream reader" not in text, [line for line in text.splitlines() if "stream reader" in line]
    raised = {
        m.group(1) for m in re.finditer(r"^[ |]*((?:\w+\.)*\w+(?:Error|Exception|Group))\b", text, re.M)
    }
    assert raised <= {"ExceptionGroup", "anyio.BrokenResourceError"}, (raised, text[-3000:])


def test_a_stream_ends_with_an_error_once_its_key_is_revoked_rotated_or_expired(
    db_url: str, settings_factory: Any
) -> None:
    settings = settings_factory(db_url, admin_keys=[f"root={ROOT}"])
    db = Database(db_url)
    root = {"Authorization": f"Bearer {ROOT}"}
    with api_process(settings) as (client, _):

        def make_key(name: str) -> dict[str, Any]:
            made = client.post("/v1/keys", json={"owner": "bob", "name": name}, headers=root)
            assert made.status_code == 201, made.text
            key: dict[str, Any] = made.json()
            return key

        keys = {why: make_key(f"bob-{why}") for why in ("revoked", "rotated", "expired")}
        bob = {"Authorization": f"Bearer {keys['revoked']['secret']}"}
        job = client.post("/v1/jobs", json={"spec": SPEC}, headers=bob).json()
        followers = {
            why: Follower(
                str(client.base_url), job["id"], headers={"Authorization": f"Bearer {key['secret']}"}
            )
            for why, key in keys.items()
        }
        untouched = Follower(str(client.base_url), job["id"], headers=root)
        for follower in [*followers.values(), untouched]:
            follower.start()
        wait_for(lambda: all(f.received for f in followers.values()), timeout_s=60, interval_s=0.1)

        assert client.delete(f"/v1/keys/{keys['revoked']['id']}", headers=root).status_code == 200
        assert client.post(f"/v1/keys/{keys['rotated']['id']}/rotate", headers=root).status_code == 201
        with db.engine.begin() as connection:
            connection.execute(
                update(ApiKey).where(ApiKey.id == keys["expired"]["id"]).values(expires_at=utcnow())
            )
        for follower in followers.values():
            follower.join(60)
            assert not follower.is_alive(), "the stream stayed open"
        # The admin's stream goes on (a status change still reaches it) until the job ends.
        assert untouched.is_alive()
        assert client.post(f"/v1/jobs/{job['id']}/cancel", headers=root).status_code == 200
        untouched.join(60)

        # Non-ASCII digits ("²" passes str.isdigit) are no id this stream sent: 422, not 500.
        odd = client.get(
            f"/v1/jobs/{job['id']}/stream", headers={**root, "Last-Event-ID": "².³".encode("latin-1")}
        )
        assert odd.status_code == 422, odd.text
        assert odd.json()["error"]["field"] == "Last-Event-ID"
    db.dispose()

    for why, follower in followers.items():
        assert not follower.errors, (why, follower.errors)
        last = follower.received[-1]
        assert last.event == "error", (why, follower.received[-3:])
        assert last.data["code"] == "unauthorized", (why, last.data)
    assert untouched.received[-1].event == "end" and untouched.received[-1].data == {"status": "cancelled"}
