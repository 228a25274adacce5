"""POST /v1/jobs with an Idempotency-Key over real HTTP, on SQLite and Postgres: concurrent repeats
make one job, another body is refused naming the header, keys are per owner, old keys expire."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy import func, select

from shared.core.db import Database
from shared.core.tables import IdempotencyKey, Job, utcnow
from shared.jobs_repo import IDEMPOTENCY_KEY_TTL_S
from tests.support.e2e import live_api

BODY = {"spec": {"model_name_or_path": "tiny-bert", "task_name": "sst2", "seed": 3}}


def test_idempotency_keys(settings_factory: Any, db_url: str) -> None:
    settings = settings_factory(db_url, api_keys=["alice-key", "bob-key"])
    alice = {"Authorization": "Bearer alice-key"}
    with live_api(settings) as client:
        url = str(client.base_url)

        def post(_: int) -> httpx.Response:
            with httpx.Client(base_url=url, timeout=30) as own:
                return own.post("/v1/jobs", json=BODY, headers={**alice, "Idempotency-Key": "race"})

        # Eight clients send the same request at once: one job, one 201, the rest 200 with it.
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(post, range(8)))
        assert sorted(a.status_code for a in answers) == [200] * 7 + [201]
        assert len({a.json()["id"] for a in answers}) == 1
        job_id = answers[0].json()["id"]

        # Spelled differently (key order, an explicit default): still the same request.
        same = client.post(
            "/v1/jobs",
            json={"priority": 0, "spec": {"seed": 3, "task_name": "sst2", "model_name_or_path": "tiny-bert"}},
            headers={**alice, "Idempotency-Key": "race"},
        )
        assert (same.status_code, same.json()["id"]) == (200, job_id)

        other = client.post(
            "/v1/jobs", json={**BODY, "priority": 5}, headers={**alice, "Idempotency-Key": "race"}
        )
        assert other.status_code == 409
        assert other.json()["error"]["field"] == "Idempotency-Key"
        assert "different request" in other.json()["error"]["message"]

        # Keys belong to their owner: Bob's "race" is a key of his own.
        bob = client.post(
            "/v1/jobs", json=BODY, headers={"Authorization": "Bearer bob-key", "Idempotency-Key": "race"}
        )
        assert bob.status_code == 201 and bob.json()["id"] != job_id

        too_long = client.post("/v1/jobs", json=BODY, headers={**alice, "Idempotency-Key": "k" * 300})
        assert too_long.status_code == 422 and too_long.json()["error"]["field"] == "Idempotency-Key"

        # Past its time a key is forgotten: the next keyed request prunes it, and it can start anew.
        db = Database(db_url)
        try:
            with db.session() as session, session.begin():
                old = utcnow() - timedelta(seconds=IDEMPOTENCY_KEY_TTL_S + 60)
                session.execute(
                    IdempotencyKey.__table__.update()
                    .where(IdempotencyKey.key == "race")
                    .values(created_at=old)
                )
            fresh = client.post("/v1/jobs", json=BODY, headers={**alice, "Idempotency-Key": "race"})
            assert fresh.status_code == 201 and fresh.json()["id"] not in (job_id, bob.json()["id"])
            with db.session() as session, session.begin():
                keys = session.execute(select(IdempotencyKey.owner, IdempotencyKey.job_id)).all()
                jobs = session.scalar(select(func.count()).select_from(Job))
            assert sorted(job for _, job in keys) == [fresh.json()["id"]]  # both old keys pruned
            assert jobs == 3
        finally:
            db.dispose()
