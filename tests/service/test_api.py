"""The HTTP API on both databases: jobs, cursors, cancel, metrics, checkpoints, events, health, keys."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from service.main import create_app
from shared import jobs_repo
from shared.core.config import Settings
from shared.core.db import Database
from shared.core.tables import JobStatus
from shared.jobs_repo import MetricRow
from tests.support import kit
from tests.support.dbutil import claimed
from tests.support.e2e import LOOPBACK_URL, run_python

SPEC = {**kit.SPEC, "task_name": "mrpc"}


@pytest.fixture
def client(settings: Settings, db: Database) -> TestClient:
    return TestClient(create_app(settings, db), base_url=LOOPBACK_URL)


def submit(client: TestClient, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/jobs", json={"spec": SPEC, **body})
    assert response.status_code == 201, response.text
    job: dict[str, Any] = response.json()
    return job


def test_create_job_answers_with_the_resolved_spec(client: TestClient) -> None:
    job = submit(client, priority=3, metadata={"team": "nlp"}, max_attempts=5)

    assert job["status"] == "queued"
    spec = job["spec"]
    # Defaults are the script's, filled in; the seed is drawn and recorded.
    assert spec["learning_rate"] == 5e-5
    assert spec["per_device_train_batch_size"] == 8
    assert spec["max_length"] == 128
    assert spec["lr_scheduler_type"] == "linear"
    assert spec["eval_strategy"] == "epoch"
    assert isinstance(spec["seed"], int)
    assert (job["priority"], job["metadata"], job["max_attempts"], job["attempts"]) == (
        3,
        {"team": "nlp"},
        5,
        0,
    )
    assert client.get(f"/v1/jobs/{job['id']}").json()["spec"] == spec


def test_aliases_and_given_seed_are_kept(client: TestClient) -> None:
    response = client.post(
        "/v1/jobs",
        json={
            "spec": {
                **SPEC,
                "max_seq_length": 64,
                "evaluation_strategy": "no",
                "seed": 42,
                "checkpointing_steps": "5",
            }
        },
    )

    spec = response.json()["spec"]
    assert (spec["max_length"], spec["eval_strategy"], spec["seed"]) == (64, "no", 42)
    assert (spec["save_strategy"], spec["save_steps"]) == ("steps", 5)


def test_list_jobs_in_cursor_pages_newest_first(client: TestClient) -> None:
    ids = [submit(client)["id"] for _ in range(5)]

    first = client.get("/v1/jobs", params={"limit": 2}).json()
    second = client.get("/v1/jobs", params={"limit": 2, "after": first["next_cursor"]}).json()
    third = client.get("/v1/jobs", params={"limit": 2, "after": second["next_cursor"]}).json()

    pages = [first, second, third]
    assert [j["id"] for p in pages for j in p["data"]] == ids[::-1]
    assert [p["has_more"] for p in pages] == [True, True, False]
    assert third["next_cursor"] is None


def test_list_jobs_filters_by_status(client: TestClient, db: Database) -> None:
    queued, cancelled = submit(client)["id"], submit(client)["id"]
    client.post(f"/v1/jobs/{cancelled}/cancel")

    only_cancelled = client.get("/v1/jobs", params={"status": "cancelled"}).json()["data"]
    both = client.get("/v1/jobs", params={"status": "queued,cancelled"}).json()["data"]
    repeated = client.get("/v1/jobs", params=[("status", "queued"), ("status", "cancelled")]).json()["data"]
    unknown = client.get("/v1/jobs", params={"status": "done"})

    assert [j["id"] for j in only_cancelled] == [cancelled]
    assert [j["id"] for j in both] == [j["id"] for j in repeated] == [cancelled, queued]
    assert unknown.status_code == 422
    assert unknown.json()["error"]["field"] == "status"


def test_unknown_job_is_a_404_with_the_error_shape(client: TestClient) -> None:
    for path in ("/v1/jobs/999", "/v1/jobs/999/metrics", "/v1/jobs/999/checkpoints", "/v1/jobs/999/events"):
        response = client.get(path)
        assert response.status_code == 404
        assert response.json() == {"error": {"code": "not_found", "message": "job 999 not found"}}
    assert client.post("/v1/jobs/999/cancel").status_code == 404


def test_cancel_queued_running_and_finished_jobs(client: TestClient, db: Database) -> None:
    queued = submit(client)
    running = submit(client)
    with db.session() as session:
        claim = claimed(session, queued["id"])  # oldest first
        jobs_repo.claim_next(session, worker_id="w", lease_s=60)

    first = client.post(f"/v1/jobs/{queued['id']}/cancel")
    assert first.status_code == 202 and first.json()["status"] == "cancelling"
    with db.session() as session:
        jobs_repo.finish_job(session, claim=claim, status=JobStatus.cancelled)

    finished = client.post(f"/v1/jobs/{queued['id']}/cancel")
    third = submit(client)
    immediate = client.post(f"/v1/jobs/{third['id']}/cancel")

    assert finished.status_code == 409
    assert finished.json()["error"]["code"] == "conflict"
    assert immediate.status_code == 200
    assert immediate.json()["status"] == "cancelled"
    assert immediate.json()["finished_at"] is not None
    assert client.get(f"/v1/jobs/{running['id']}").json()["status"] == "running"


def test_metrics_poll_with_a_cursor_and_filters(client: TestClient, db: Database) -> None:
    job = submit(client)
    with db.session() as session:
        jobs_repo.add_metrics(
            session,
            claim=claimed(session, job["id"]),
            job_id=job["id"],
            rows=[
                MetricRow(0.5, 10, "train", "loss", 0.69),
                MetricRow(0.5, 10, "train", "learning_rate", 4e-5),
                MetricRow(1.0, 20, "eval", "accuracy", 0.75),
                MetricRow(1.0, 20, "eval", "f1", 0.8),
            ],
            best_metric="f1",
        )

    page = client.get(f"/v1/jobs/{job['id']}/metrics", params={"limit": 3}).json()
    rest = client.get(f"/v1/jobs/{job['id']}/metrics", params={"after": page["next_cursor"]}).json()
    evals = client.get(f"/v1/jobs/{job['id']}/metrics", params={"split": "eval", "name": "f1"}).json()
    nothing_new = client.get(f"/v1/jobs/{job['id']}/metrics", params={"after": rest["data"][-1]["id"]}).json()
    read = client.get(f"/v1/jobs/{job['id']}").json()

    assert [r["name"] for r in page["data"]] == ["loss", "learning_rate", "accuracy"]
    assert page["has_more"] and not rest["has_more"]
    assert [(r["step"], r["split"], r["name"], r["value"]) for r in rest["data"]] == [(20, "eval", "f1", 0.8)]
    assert set(rest["data"][0]) == {"id", "epoch", "step", "split", "name", "value", "created_at"}
    assert [r["value"] for r in evals["data"]] == [0.8]
    assert nothing_new == {"data": [], "has_more": False, "next_cursor": None}
    assert read["latest_metrics"]["eval"]["accuracy"] == 0.75
    assert read["best_metrics"]["metric"] == "f1"


def test_checkpoints_and_events(client: TestClient, db: Database) -> None:
    job = submit(client)
    with db.session() as session:
        claim = claimed(session, job["id"])
        jobs_repo.add_checkpoint(
            session,
            job_id=job["id"],
            step=46,
            epoch=1.0,
            path="/a/checkpoint-46",
            metrics={"accuracy": 0.7},
            is_best=True,
            claim=claim,
        )
        jobs_repo.add_event(session, job_id=job["id"], message="hello", claim=claim)

    checkpoints = client.get(f"/v1/jobs/{job['id']}/checkpoints").json()["data"]
    events = client.get(f"/v1/jobs/{job['id']}/events").json()
    later = client.get(f"/v1/jobs/{job['id']}/events", params={"after": events["data"][0]["id"]}).json()

    assert checkpoints == [
        {
            "epoch": 1.0,
            "step": 46,
            "path": "/a/checkpoint-46",
            "download": f"gluejobs download {job['id']} DIR --checkpoint 46",
            "metrics": {"accuracy": 0.7},
            "created_at": checkpoints[0]["created_at"],
            "is_best": True,
        }
    ]
    # A checkpoint is also an event, so the live stream and the event cursor carry it in order.
    assert [(e["kind"], e["message"]) for e in events["data"]] == [
        ("state", "job queued"),
        ("state", "claimed by worker w (attempt 1 of 3)"),
        ("checkpoint", "checkpoint at step 46 (best so far)"),
        ("log", "hello"),
    ]
    assert [e["message"] for e in later["data"]] == [
        "claimed by worker w (attempt 1 of 3)",
        "checkpoint at step 46 (best so far)",
        "hello",
    ]


def test_metric_polling_is_an_index_range_scan(db: Database) -> None:
    """`after=` costs the same for ten rows or a hundred thousand: the query walks the (job_id, id) index."""
    query = "SELECT id FROM job_metrics WHERE job_id = 1 AND id > 5 ORDER BY id LIMIT 1000"
    with db.engine.connect() as connection:
        if db.dialect == "sqlite":
            plan = " ".join(str(row[-1]) for row in connection.execute(text(f"EXPLAIN QUERY PLAN {query}")))
            assert "USING COVERING INDEX ix_job_metrics_job_id_id (job_id=? AND id>?)" in plan
        else:
            connection.execute(text("SET enable_seqscan = off"))  # an empty table would be scanned otherwise
            plan = " ".join(row[0] for row in connection.execute(text(f"EXPLAIN {query}")))
            assert "ix_job_metrics_job_id_id" in plan


def test_health_and_readiness(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok", "database": None, "detail": None}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ok"


def test_readiness_fails_on_an_unmigrated_database(settings_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    settings = settings_factory(f"sqlite:///{tmp_path / 'empty.db'}")
    client = TestClient(create_app(settings), base_url=LOOPBACK_URL)

    response = client.get("/readyz")

    assert response.status_code == 503
    assert "not migrated" in response.json()["detail"]


def test_openapi_documents_the_job_spec(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()

    assert {
        "/v1/jobs",
        "/v1/jobs/{job_id}",
        "/v1/jobs/{job_id}/cancel",
        "/v1/jobs/{job_id}/metrics",
        "/v1/jobs/{job_id}/checkpoints",
        "/v1/jobs/{job_id}/events",
        "/healthz",
        "/readyz",
    } <= set(schema["paths"])
    assert "learning_rate" in schema["components"]["schemas"]["JobSpec"]["properties"]
    assert client.get("/docs").status_code == 200


class TestApiKeys:
    @pytest.fixture
    def keyed(self, settings: Settings, db: Database) -> TestClient:
        import hashlib

        admin_digest = hashlib.sha256(b"admin-key").hexdigest()
        keyed = settings.model_copy(
            update={"api_keys": ["alice-key", "bob-key"], "admin_keys": [f"sha256:{admin_digest}"]}
        )
        return TestClient(create_app(keyed, db), base_url=LOOPBACK_URL)

    @staticmethod
    def auth(key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    def test_requests_need_a_valid_key(self, keyed: TestClient) -> None:
        missing = keyed.get("/v1/jobs")
        wrong = keyed.get("/v1/jobs", headers=self.auth("nope"))

        assert missing.status_code == wrong.status_code == 401
        assert missing.json()["error"]["code"] == "unauthorized"
        assert missing.headers["www-authenticate"] == "Bearer"
        assert keyed.get("/healthz").status_code == 200  # probes need no key

    def test_jobs_belong_to_the_key_that_made_them(self, keyed: TestClient, db: Database) -> None:
        alice = keyed.post("/v1/jobs", json={"spec": SPEC}, headers=self.auth("alice-key")).json()
        bob = keyed.post("/v1/jobs", json={"spec": SPEC}, headers=self.auth("bob-key")).json()

        alices = keyed.get("/v1/jobs", headers=self.auth("alice-key")).json()["data"]
        admins = keyed.get("/v1/jobs", headers=self.auth("admin-key")).json()["data"]

        assert [j["id"] for j in alices] == [alice["id"]]
        assert {j["id"] for j in admins} == {alice["id"], bob["id"]}
        assert keyed.get(f"/v1/jobs/{bob['id']}", headers=self.auth("alice-key")).status_code == 404
        assert keyed.post(f"/v1/jobs/{bob['id']}/cancel", headers=self.auth("alice-key")).status_code == 404
        assert keyed.get(f"/v1/jobs/{bob['id']}/metrics", headers=self.auth("alice-key")).status_code == 404
        assert keyed.post(f"/v1/jobs/{bob['id']}/cancel", headers=self.auth("admin-key")).status_code == 200


STARTUP_FREEZE = """
import asyncio, gc, sys, threading
from service.main import create_app
from shared.core.config import Settings

app = create_app(Settings(database_url=sys.argv[1], search_driver=False))


async def start() -> int:
    async with app.router.lifespan_context(app):
        return gc.get_freeze_count()

counts = []
embedded = threading.Thread(target=lambda: counts.append(asyncio.run(start())))
embedded.start()
embedded.join()
counts += [asyncio.run(start()), asyncio.run(start())]
print(*counts)
"""


@pytest.mark.e2e  # an interpreter of its own
def test_the_api_hides_what_it_holds_at_start_from_the_garbage_collector(
    sqlite_url: str, tmp_path: Path
) -> None:
    """A full collection over the API's startup objects held every open stream's rows back about
    100 ms every dozen seconds (service/main._freeze_startup_objects): frozen once, where the API
    owns the process (its lifespan in the main thread), never in a program that embeds it."""
    output = run_python(STARTUP_FREEZE, sqlite_url, cwd=tmp_path, env=dict(os.environ))
    embedded, started, again = map(int, output.split())
    # Once: a second start freezes nothing more (frozen objects that die still leave the count).
    assert embedded == 0 and started > 50_000 and again <= started
