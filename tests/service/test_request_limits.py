"""Requests cost the API a bounded amount and answer with a fitting status, never a 500: job-id lists
are parsed as ASCII digits in one bounded pass, dry runs are limited to GLUEJOBS_MAX_DRY_RUNS at once
(429 + Retry-After), artifact paths too long for a file name get 422; /metrics names other owners'
jobs to admin keys only, shows a user key only its owner's jobs, and counts against the key's rate
limit. Against a live API on SQLite and Postgres."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import service.routes.jobs as jobs_routes
from shared import jobs_repo
from shared.core.db import Database
from shared.jobs_repo import MetricRow
from tests.support.e2e import live_api, wait_for
from tests.support.kit import ALICE, BOB, ROOT, SPEC, auth


@pytest.fixture
def api(settings_factory: Any, db_url: str) -> Iterator[httpx.Client]:
    settings = settings_factory(db_url, api_keys=[ALICE, BOB], admin_keys=[ROOT], max_dry_runs=1)
    with live_api(settings) as client:
        yield client


# Parsing and limits: no database rule is involved, so one database is enough.
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_job_id_lists_are_ascii_digits_and_bounded(api: httpx.Client) -> None:
    job = api.post("/v1/jobs", json={"spec": SPEC}, headers=auth(ALICE)).json()
    for value, message in (
        ("²", "'²' is not a job id"),  # isdigit() says yes, int() says no: it was a 500
        ("١", "'١' is not a job id"),  # Arabic-Indic one: int() reads it as 1
        (f"{job['id']},x", "'x' is not a job id"),
        ("99999999999999999999", "is not a job id"),  # beyond 64 bits
        (",".join(map(str, range(1, 30))), "at most 20 jobs in one bundle"),
        (",".join(["1"] * 6000), "at most 20 jobs in one bundle"),  # 12 KB: stops at the 200th part
    ):
        response = api.get("/v1/submissions", params={"jobs": value}, headers=auth(ALICE))
        assert response.status_code == 422, (value[:20], response.text)
        assert response.json()["error"]["field"] == "jobs"
        assert message in response.json()["error"]["message"]
    # Repeated and comma-separated ids name the same jobs; an ASCII id reaches the bundler.
    named = api.get(
        "/v1/submissions", params=[("jobs", str(job["id"])), ("jobs", f" {job['id']} ")], headers=auth(ALICE)
    )
    assert named.status_code == 422 and "has not succeeded" in named.json()["error"]["message"]


# Parsing and limits: no database rule is involved, so one database is enough.
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_dry_runs_beyond_the_limit_get_429(api: httpx.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    inside, release = threading.Event(), threading.Event()
    real_plan = jobs_routes.plan_job

    def slow_plan(*args: Any, **kwargs: Any) -> Any:
        inside.set()
        release.wait(30)
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(jobs_routes, "plan_job", slow_plan)
    first: list[httpx.Response] = []
    planner = threading.Thread(
        target=lambda: first.append(
            api.post("/v1/jobs", params={"dry_run": "true"}, json={"spec": SPEC}, headers=auth(ALICE))
        )
    )
    planner.start()
    assert inside.wait(30)
    try:
        for key in (ALICE, BOB):  # the limit is the API's, whoever asks
            busy = api.post("/v1/jobs", params={"dry_run": "true"}, json={"spec": SPEC}, headers=auth(key))
            assert busy.status_code == 429, busy.text
            assert busy.headers["retry-after"] == "2"
            assert busy.json()["error"]["code"] == "too_many_requests"
        # Submitting is not a dry run: it is not held up.
        assert api.post("/v1/jobs", json={"spec": SPEC}, headers=auth(BOB)).status_code == 201
    finally:
        release.set()
        planner.join(60)
    assert first[0].status_code == 200, first[0].text
    # The slot is free again.
    again = api.post("/v1/jobs", params={"dry_run": "true"}, json={"spec": SPEC}, headers=auth(BOB))
    assert again.status_code == 200, again.text


# Parsing and limits: no database rule is involved, so one database is enough.
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_artifact_path_too_long_for_a_file_name_is_refused(api: httpx.Client) -> None:
    job = api.post("/v1/jobs", json={"spec": SPEC}, headers=auth(ALICE)).json()
    for path in ("a" * 256, f"checkpoints/{'é' * 128}", "/".join(["d" * 200] * 25)):
        response = api.get(f"/v1/jobs/{job['id']}/artifacts/{path}", headers=auth(ALICE))
        assert response.status_code == 422, response.text
        assert response.json()["error"]["field"] == "path"
        assert "longer than a file name can be" in response.json()["error"]["message"]
        assert len(response.content) < 600
    assert api.get(f"/v1/jobs/{job['id']}/artifacts/{'a' * 255}", headers=auth(ALICE)).status_code == 404


def test_metrics_name_jobs_to_admin_keys_only(api: httpx.Client, db: Database) -> None:
    job = api.post("/v1/jobs", json={"spec": SPEC}, headers=auth(ALICE)).json()
    with db.session() as session:
        jobs_repo.register_worker(session, worker_id="w1", host="h", pid=1)
        claimed = jobs_repo.claim_next(session, worker_id="w1", lease_s=60)
        assert claimed is not None and claimed.id == job["id"]
        claim = jobs_repo.Claim(job_id=job["id"], worker_id="w1", attempt=claimed.attempts)
        for step in (1, 2):
            jobs_repo.add_metrics(
                session, job_id=job["id"], rows=[MetricRow(0.1, step, "train", "loss", 0.5)], claim=claim
            )
            time.sleep(0.05)

    def throughput(key: str) -> list[Any]:
        scrape = api.get("/metrics", headers=auth(key))
        assert scrape.status_code == 200
        families = {f.name: f for f in text_string_to_metric_families(scrape.text)}
        return families["gluejobs_job_train_samples_per_second"].samples

    admin = wait_for(lambda: throughput(ROOT), timeout_s=10)
    assert [s.labels for s in admin] == [{"job": str(job["id"])}] and admin[0].value > 0
    # A user key sees the sum of its owner's jobs (no job ids at all), and nothing of others' jobs.
    [alices] = throughput(ALICE)
    assert alices.labels == {} and alices.value == pytest.approx(admin[0].value)
    [bobs] = throughput(BOB)
    assert bobs.labels == {} and bobs.value == 0


def test_a_user_key_sees_its_own_jobs_in_metrics_and_no_fleet(api: httpx.Client, db: Database) -> None:
    for key, count in ((ALICE, 2), (BOB, 1)):
        for _ in range(count):
            assert api.post("/v1/jobs", json={"spec": SPEC}, headers=auth(key)).status_code == 201
    with db.session() as session:
        jobs_repo.register_worker(session, worker_id="w1", host="h", pid=1)

    def samples(key: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        scrape = api.get("/metrics", headers=auth(key))
        assert scrape.status_code == 200, scrape.text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(scrape.text)
            for s in family.samples
        }

    queued = ("gluejobs_jobs", (("status", "queued"),))
    everyone, alices, bobs = samples(ROOT), samples(ALICE), samples(BOB)
    assert (everyone[queued], alices[queued], bobs[queued]) == (3, 2, 1)
    assert (alices[("gluejobs_queue_depth", ())], bobs[("gluejobs_queue_depth", ())]) == (2, 1)
    assert any(name.startswith("gluejobs_worker") for name, _ in everyone)
    assert not any(name.startswith("gluejobs_worker") for name, _ in [*alices, *bobs])


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_metrics_scrapes_count_against_the_keys_rate_limit(settings_factory: Any, db_url: str) -> None:
    settings = settings_factory(db_url, api_keys=[ALICE, BOB], rate_reads_per_minute=5)
    with live_api(settings) as api:
        answers = [api.get("/metrics", headers=auth(ALICE)).status_code for _ in range(8)]
        assert answers[:5] == [200] * 5 and set(answers[5:]) == {429}
        assert api.get("/v1/jobs", headers=auth(ALICE)).status_code == 429  # one limit for both
        assert api.get("/metrics", headers=auth(BOB)).status_code == 200  # a key's own limit
        assert api.get("/metrics").status_code == 401
