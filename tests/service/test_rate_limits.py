"""Rate limits per key (service/edge/rate_limits.py), the same on every API process: two real API
processes share one database (SQLite, Postgres), and one key's burst over its limit gets 429
`rate_limited` with Retry-After whichever process it reaches; reads and writes are counted apart;
the Python client waits as asked and gets through; a key's open streams are capped across
processes, and a closed stream frees its slot; cursor polls with a stored key take no write lock."""

from __future__ import annotations

import time
from contextlib import ExitStack
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import func, insert, select

from gluejobs._types import ApiError
from gluejobs.client import Client, RetryPolicy
from service.accounts import api_keys
from service.accounts.auth import KEY_CACHE_S, KeyRing
from service.edge.rate_limits import FLUSH_S, STALE_S, WINDOW_S
from shared import jobs_repo
from shared.core.db import WRITE_OPTION, Database
from shared.core.tables import Job, KeyRole, OpenStream, RateWindow, utcnow
from shared.jobs_repo import Claim, MetricRow
from tests.support.e2e import api_process, live_api, wait_for
from tests.support.kit import SPEC, auth

ALICE = "alice-rate-limit-key-0001"
BOB = "bob-rate-limit-key-00002"


def bucket_of(settings: Any, key: str) -> str:
    """The bucket the API counts `key`'s requests in, as the API's own key ring finds it."""
    return KeyRing.from_settings(settings).principal(f"Bearer {key}").bucket


def fresh_window(needed_s: float = 20.0) -> None:
    """Wait for the next minute when less than `needed_s` of this one is left, so that a burst falls
    in one window (a wait for a clean start, not a timing assertion)."""
    left = WINDOW_S - time.time() % WINDOW_S
    if left < needed_s:
        time.sleep(left + 0.2)


def assert_rate_limited(response: httpx.Response) -> int:
    assert response.status_code == 429, response.text
    assert response.json()["error"]["code"] == "rate_limited"
    retry_after = int(response.headers["Retry-After"])
    assert 1 <= retry_after <= WINDOW_S
    return retry_after


@pytest.mark.e2e
def test_a_burst_over_the_limit_is_refused_on_every_process_and_the_client_waits_it_out(
    settings_factory: Any, db_url: str
) -> None:
    settings = settings_factory(
        db_url,
        api_keys=[f"alice={ALICE}", f"bob={BOB}"],
        rate_submits_per_minute=5,
        rate_reads_per_minute=8,
    )
    db = Database(db_url)
    with api_process(settings) as (one, _), api_process(settings) as (two, _):
        fresh_window()
        # Eight submissions, half to each process: five are taken, the other three refused.
        answers = [
            (one, two)[i % 2].post("/v1/jobs", json={"spec": SPEC}, headers=auth(ALICE)) for i in range(8)
        ]
        assert sorted(a.status_code for a in answers) == [201] * 5 + [429] * 3, [a.text for a in answers]
        for refused in (a for a in answers if a.status_code == 429):
            assert_rate_limited(refused)
        with db.engine.connect() as connection:  # refused requests stored nothing
            assert connection.scalar(select(func.count()).select_from(Job)) == 5

        # Reads have a budget of their own, untouched by the writes, shared by both processes.
        reads = [(one, two)[i % 2].get("/v1/jobs", headers=auth(ALICE)) for i in range(9)]
        assert [r.status_code for r in reads] == [200] * 8 + [429]
        assert_rate_limited(reads[-1])
        # Another key counts on its own; the health routes are never counted.
        assert two.post("/v1/jobs", json={"spec": SPEC}, headers=auth(BOB)).status_code == 201
        assert all(c.get("/healthz").status_code == 200 for c in (one, two) for _ in range(10))
    db.dispose()


# One database: waiting out the minute costs a minute, and the windows' rows are written alike on
# both (the burst above is refused through them on both).
@pytest.mark.e2e
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_refused_client_waits_out_the_minute_and_gets_in(settings_factory: Any, db_url: str) -> None:
    settings = settings_factory(db_url, api_keys=[f"alice={ALICE}"], rate_submits_per_minute=5)
    db = Database(db_url)
    with api_process(settings) as (api, _):
        fresh_window()
        assert [
            api.post("/v1/jobs", json={"spec": SPEC}, headers=auth(ALICE)).status_code for _ in range(5)
        ] == [201] * 5
        # The client is refused, waits the Retry-After it is given (past the minute), and gets in.
        writes = f"w:{bucket_of(settings, ALICE)}"
        patient = RetryPolicy(retries=2, retry_after_max_s=WINDOW_S + 5)
        with Client(str(api.base_url), api_key=ALICE, retries=patient) as client:
            job = client.jobs.create(SPEC)
        with db.engine.connect() as connection:
            counts = dict(
                connection.execute(
                    select(RateWindow.window, RateWindow.count).where(RateWindow.bucket == writes)
                ).all()
            )
            stored = connection.scalar(select(func.count()).select_from(Job).where(Job.owner == "alice"))
    db.dispose()
    # Two tries: one refused in the full minute (5 + 1), one taken in the next.
    assert sorted(counts.values()) == [1, 6] and max(counts) == min(counts) + 1, counts
    assert counts[max(counts)] == 1
    assert job.id and stored == 6


def test_a_client_still_refused_after_its_retries_says_so(settings_factory: Any, sqlite_url: str) -> None:
    settings = settings_factory(sqlite_url, api_keys=[ALICE], rate_submits_per_minute=1)
    with live_api(settings) as http:
        fresh_window(5.0)
        assert http.post("/v1/jobs", json={"spec": SPEC}, headers=auth(ALICE)).status_code == 201
        # A client that waits at most 0.1 s per try cannot outlast the minute.
        hasty = RetryPolicy(retries=2, backoff_base_s=0.01, retry_after_max_s=0.1)
        with (
            Client(str(http.base_url), api_key=ALICE, retries=hasty) as client,
            pytest.raises(ApiError) as caught,
        ):
            client.jobs.create(SPEC)
    assert (caught.value.status_code, caught.value.code) == (429, "rate_limited")
    assert "still refused after 3 tries" in caught.value.message


def test_a_database_error_while_counting_answers_503(settings_factory: Any, sqlite_url: str) -> None:
    settings = settings_factory(f"{sqlite_url}?timeout=0.2", api_keys=[ALICE])
    db = Database(sqlite_url)
    with live_api(settings) as http, db.engine.connect().execution_options(**{WRITE_OPTION: True}) as holder:
        with holder.begin():  # BEGIN IMMEDIATE: the write lock, held; a write's count cannot be written
            # A read is counted in memory (written with others once a second): it needs no lock.
            assert http.get("/v1/jobs", headers=auth(ALICE)).status_code == 200
            refused = http.post("/v1/jobs", json={"spec": SPEC}, headers=auth(ALICE))
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "database_unavailable" and "Retry-After" in refused.headers
        assert http.post("/v1/jobs", json={"spec": SPEC}, headers=auth(ALICE)).status_code == 201
    db.dispose()


@pytest.mark.e2e
def test_one_key_holds_at_most_its_cap_of_open_streams_across_processes(
    settings_factory: Any, db_url: str
) -> None:
    settings = settings_factory(db_url, api_keys=[f"alice={ALICE}", f"bob={BOB}"], max_streams_per_key=2)
    db = Database(db_url)
    alice = bucket_of(settings, ALICE)
    # Rows left by a process that died (never refreshed) do not count.
    stale = utcnow() - timedelta(seconds=STALE_S + 5)
    with db.engine.begin() as connection:
        for _ in range(3):
            connection.execute(
                insert(OpenStream).values(bucket=alice, job_id=1, opened_at=stale, seen_at=stale)
            )

    def open_rows(bucket: str) -> int:
        with db.engine.connect() as connection:
            return int(
                connection.scalar(
                    select(func.count()).select_from(OpenStream).where(OpenStream.bucket == bucket)
                )
                or 0
            )

    with api_process(settings) as (one, _), api_process(settings) as (two, _), ExitStack() as streams:
        mine = one.post("/v1/jobs", json={"spec": SPEC}, headers=auth(ALICE)).json()["id"]
        bobs = one.post("/v1/jobs", json={"spec": SPEC}, headers=auth(BOB)).json()["id"]

        def stream(client: httpx.Client, job_id: int, key: str) -> httpx.Response:
            return streams.enter_context(client.stream("GET", f"/v1/jobs/{job_id}/stream", headers=auth(key)))

        first = stream(one, mine, ALICE)
        second = stream(two, mine, ALICE)
        assert (first.status_code, second.status_code) == (200, 200)
        over = stream(one, mine, ALICE)
        over.read()
        assert_rate_limited(over)
        assert stream(two, bobs, BOB).status_code == 200  # another key's streams are its own

        first.close()  # its slot is freed once the API sees the client gone
        wait_for(lambda: open_rows(alice) == 1, timeout_s=30)
        assert stream(two, mine, ALICE).status_code == 200
        assert open_rows(alice) == 2
    db.dispose()


def test_cursor_polls_with_a_stored_key_take_no_write_lock(settings_factory: Any, sqlite_url: str) -> None:
    """A dashboard's polls (GET /metrics?after=) with a key made over the API, for longer than the
    key cache's bound (the key is looked up again) and the read counts' flush interval, while another
    connection holds SQLite's write lock: every poll is answered, so none needed the lock (with a
    0.2 s busy timeout, one that did would get 503). The counts wait for the lock; none is lost."""
    db = Database(sqlite_url)
    with db.session() as session:
        _, secret = api_keys.create_key(
            session, owner="alice", role=KeyRole.user, name="poller", expires_at=None, actor=None
        )
        job = jobs_repo.create_job(session, spec=SPEC, owner="alice")
        claimed = jobs_repo.claim_next(session, worker_id="w", lease_s=3600)
        assert claimed is not None and claimed.id == job.id
        rows = [MetricRow(epoch=0.0, step=s, split="train", name="loss", value=1.0) for s in range(20)]
        jobs_repo.add_metrics(session, job_id=job.id, rows=rows, claim=Claim(job.id, "w", claimed.attempts))
    settings = settings_factory(f"{sqlite_url}?timeout=0.2")
    path = f"/v1/jobs/{job.id}/metrics"
    with live_api(settings) as http, db.engine.connect().execution_options(**{WRITE_OPTION: True}) as holder:
        # The first request writes the key's last_used_at (once a minute at most): before the lock.
        first = http.get(path, params={"limit": 1}, headers=auth(secret))
        assert first.status_code == 200, first.text
        cursor = first.json()["data"][0]["id"]
        polls = []
        with holder.begin():  # BEGIN IMMEDIATE: SQLite's one write lock, held by this connection
            deadline = time.monotonic() + max(KEY_CACHE_S, FLUSH_S) * 2.5
            while time.monotonic() < deadline:
                polls.append(http.get(path, params={"after": cursor, "limit": 5}, headers=auth(secret)))
                time.sleep(0.05)
            assert [p.status_code for p in polls] == [200] * len(polls), [p.text for p in polls[-3:]]
            assert [m["step"] for m in polls[-1].json()["data"]] == [1, 2, 3, 4, 5]

        # Lock released: the counts kept in memory reach the table with the next flush.
        def counted() -> int:
            with db.engine.connect() as connection:
                reads = select(func.sum(RateWindow.count)).where(RateWindow.bucket.like("r:%"))
                return int(connection.scalar(reads) or 0)

        wait_for(lambda: counted() >= 1 + len(polls), timeout_s=10)
    db.dispose()
