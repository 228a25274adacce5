"""While the database is away the API answers 503 `database_unavailable` with Retry-After, keeps its
keep-alive connections, logs the outage once, and an open stream goes on afterwards without losing
or repeating an event. `python -m service` in its own process; Postgres refusing connections
(ALTER DATABASE … ALLOW_CONNECTIONS false, its sessions terminated) and SQLite's write lock held
past the busy timeout (SQLite has no server to lose: a held lock is how it becomes unreachable, to
writers; its readers go on)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared import jobs_repo
from shared.core.db import Database
from shared.core.tables import JobStatus
from tests.support.dbutil import claimed
from tests.support.e2e import api_process, wait_for
from tests.support.kit import POSTGRES_URL, SPEC
from tests.support.observe_helpers import read_sse
from tests.support.outages import outage

pytestmark = pytest.mark.e2e

OUTAGE_S = 5.0
REQUESTS = 200
THREADS = 4


def mixed_requests(job_id: int) -> list[tuple[str, str, dict[str, Any] | None]]:
    """What clients do all day: list, read, poll, submit, sweep, check health, scrape."""
    cycle: list[tuple[str, str, dict[str, Any] | None]] = [
        ("GET", "/v1/jobs", None),
        ("GET", f"/v1/jobs/{job_id}", None),
        ("GET", f"/v1/jobs/{job_id}/metrics", None),
        ("POST", "/v1/jobs", {"spec": SPEC}),
        ("GET", f"/v1/jobs/{job_id}/events", None),
        ("GET", "/healthz", None),
        ("GET", "/readyz", None),
        ("GET", "/metrics", None),
        ("GET", f"/v1/jobs/{job_id}/checkpoints", None),
        ("POST", "/v1/sweeps", {"spec": SPEC, "seeds": [1]}),
    ]
    return [cycle[i % len(cycle)] for i in range(REQUESTS // THREADS)]


def test_an_outage_costs_503s_and_nothing_else(db_url: str, settings_factory: Any, tmp_path: Path) -> None:
    sqlite = db_url.startswith("sqlite")
    # SQLite: a writer waits 1 s for the lock (not 30) before the API gives up on it.
    settings = settings_factory(f"{db_url}?timeout=1" if sqlite else db_url)
    db = Database(db_url)
    log = tmp_path / "api.log"
    with api_process(settings, log=log) as (client, _):
        job = client.post("/v1/jobs", json={"spec": SPEC}).json()
        with db.session() as session:  # the events are written as the job's process would
            claim = claimed(session, job["id"])

        def add_events(first: int, count: int) -> None:
            with db.session() as session:
                for n in range(first, first + count):
                    jobs_repo.add_event(session, job_id=job["id"], message=f"row {n}", claim=claim)

        streamed: list[Any] = []
        stream_error: list[BaseException] = []

        def follow() -> None:
            try:
                with (
                    httpx.Client(base_url=client.base_url, timeout=60) as reader,
                    reader.stream("GET", f"/v1/jobs/{job['id']}/stream") as response,
                ):
                    assert response.status_code == 200
                    streamed.extend(read_sse(response))
            except BaseException as exc:  # reported by the test below
                stream_error.append(exc)

        reader = threading.Thread(target=follow)
        reader.start()
        add_events(1, 5)
        wait_for(lambda: sum(m.event == "event" for m in streamed) == 5, timeout_s=30, interval_s=0.1)

        answers: list[httpx.Response] = []
        failures: list[BaseException] = []

        def hammer() -> None:
            with httpx.Client(base_url=client.base_url, timeout=60) as own:  # one keep-alive connection
                for method, path, body in mixed_requests(job["id"]):
                    try:
                        answers.append(own.request(method, path, json=body))
                    except httpx.TransportError as exc:  # a reset or dropped connection
                        failures.append(exc)
                    time.sleep(OUTAGE_S / (REQUESTS / THREADS))

        with outage(db_url, POSTGRES_URL):
            threads = [threading.Thread(target=hammer) for _ in range(THREADS)]
            for thread in threads:
                thread.start()
            time.sleep(OUTAGE_S)
        for thread in threads:
            thread.join(120)
        add_events(6, 5)
        assert client.post(f"/v1/jobs/{job['id']}/cancel").status_code == 202  # cancelling
        with db.session() as session:  # the worker stops the job, which ends the stream
            assert jobs_repo.finish_job(session, claim=claim, status=JobStatus.cancelled)
        reader.join(60)
        # The end of the outage is logged at the first success after a quiet spell.
        wait_for(
            lambda: (
                client.get("/readyz").status_code == 200 and "database reachable again" in log.read_text()
            ),
            timeout_s=30,
        )

    assert not failures, failures
    assert not stream_error, stream_error
    statuses = Counter(response.status_code for response in answers)
    assert len(answers) == REQUESTS, statuses
    assert set(statuses) <= {200, 201, 503}, statuses
    assert statuses[503] > 0, statuses  # the outage was felt
    for response in answers:
        if response.status_code == 503:
            assert response.headers["retry-after"] == "2"
            assert response.headers.get("connection") != "close"
            if response.url.path != "/readyz":
                assert response.json()["error"]["code"] == "database_unavailable", response.text
        if response.url.path == "/healthz":
            assert response.status_code == 200
    # The stream: every row once, in order, then its end.
    rows = [m.data["message"] for m in streamed if m.event == "event"]
    assert rows == [f"row {n}" for n in range(1, 11)], rows
    ids = [m.id for m in streamed if m.id and m.event != "end"]  # `end` repeats the last cursor
    assert len(ids) == len(set(ids)) and ids == sorted(ids, key=lambda i: tuple(map(int, i.split("."))))
    assert streamed[-1].event == "end" and streamed[-1].data == {"status": "cancelled"}
    # The log: the outage once as it began and once as it ended, no traceback per request.
    text = log.read_text()
    assert text.count("database unreachable (") == 1, text[-3000:]
    assert text.count("database reachable again:") == 1, text[-3000:]
    assert "Traceback" not in text
    db.dispose()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_readiness_follows_the_database(db_url: str, settings_factory: Any) -> None:
    with api_process(settings_factory(db_url)) as (client, _):
        assert client.get("/readyz").status_code == 200
        with outage(db_url, POSTGRES_URL):
            answer = client.get("/readyz")
            assert answer.status_code == 503 and answer.headers["retry-after"] == "2"
            assert answer.json()["detail"] == "database unreachable (OperationalError)"  # no host, no user
            assert client.get("/healthz").status_code == 200
        assert wait_for(lambda: client.get("/readyz").status_code == 200, timeout_s=30)
