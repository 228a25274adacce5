"""The dashboard in a real headless browser (Debian's chromium, driven by Playwright) against a live
API and a real worker: the list loads and filters, a training job's curves get points while it
trains, the cancel button cancels, compare overlays jobs, an API key is asked for once and scopes
what the page shows, and the browser logs no errors."""

from __future__ import annotations

import os
import shutil
import signal
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared import jobs_repo
from shared.db import Database
from shared.jobs_repo import MetricRow
from shared.models import JobStatus
from tests.dbutil import claimed
from tests.e2e import get, live_api, start_worker, submit
from tests.observe_helpers import TINY_SPEC, observe_settings

CHROMIUM = Path("/usr/bin/chromium")
# Headless, and nothing that reaches the network on its own (updates, sync, first-run pages).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# Set to a path (e.g. docs/dashboard.png) to keep the job page's screenshot there.
SCREENSHOT_ENV = "GLUEJOBS_DASHBOARD_SCREENSHOT"
UNAUTHORIZED_LOAD = "the server responded with a status of 401"


@pytest.fixture
def browser() -> Iterator[Any]:
    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: `make test` installs it (apt-get install chromium)"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        yield launched
        launched.close()


def console_errors(page: Any) -> list[str]:
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(f"page error: {error}"))
    return errors


def points(page: Any, chart: str) -> int:
    return int(page.get_attribute(f'[data-chart="{chart}"]', "data-points") or 0)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_dashboard_follows_and_cancels_a_training_job(
    settings_factory: Any, tmp_path: Path, glue_data: Path, db_url: str, browser: Any
) -> None:
    settings = observe_settings(settings_factory, tmp_path, glue_data, db_url)
    long_job = {
        **TINY_SPEC,
        "max_train_samples": 160,  # 10 steps an epoch
        "num_train_epochs": 40,
        "save_strategy": "epoch",
        "save_total_limit": 2,
    }
    with live_api(settings) as client:
        base = str(client.base_url).rstrip("/")
        job = submit(client, long_job)
        other = submit(client, {**TINY_SPEC, "seed": 8})
        assert client.post(f"/v1/jobs/{other['id']}/cancel").json()["status"] == "cancelled"
        worker = start_worker(settings, log=tmp_path / "worker.log")
        page = browser.new_page(viewport={"width": 1440, "height": 1500})
        errors = console_errors(page)
        try:
            # The list loads, with both jobs; the status filter narrows it.
            page.goto(f"{base}/")
            page.wait_for_selector(f'tr[data-job="{job["id"]}"]')
            assert page.locator(f'tr[data-job="{other["id"]}"] [data-status="cancelled"]').count() == 1
            page.select_option("#status-filter", "cancelled")
            # The filtered view is a new view: wait for its rows before looking at what it left out.
            page.wait_for_selector(f'tr[data-job="{other["id"]}"] [data-status="cancelled"]')
            assert page.locator(f'tr[data-job="{job["id"]}"]').count() == 0
            page.select_option("#status-filter", "")
            # It updates live: the job starts running without a reload.
            page.wait_for_selector(f'tr[data-job="{job["id"]}"] [data-status="running"]', timeout=90_000)

            # The job page: curves get points while the job trains.
            page.click(f'a[href="#/jobs/{job["id"]}"]')
            page.wait_for_function(
                "() => Number(document.querySelector('[data-chart=\"loss\"]')?.dataset.points) >= 3"
            )
            first_losses = points(page, "loss")
            page.wait_for_function(
                "() => Number(document.querySelector('[data-chart=\"eval accuracy\"]')?.dataset.points) >= 3",
                timeout=90_000,
            )
            # More loss points arrive while the job still trains (rows come in flushed batches).
            page.wait_for_function(
                "(n) => Number(document.querySelector('[data-chart=\"loss\"]')?.dataset.points) > n",
                arg=first_losses,
                timeout=90_000,
            )
            assert points(page, "learning_rate") >= 3
            assert get(client, f"/v1/jobs/{job['id']}")["status"] == "running"
            page.wait_for_selector("#checkpoints tr.best")
            page.wait_for_function("() => document.querySelector('#log').textContent.includes('training:')")
            assert page.locator("#events li").count() >= 3
            assert '"task_name": "sst2"' in (page.text_content("#spec") or "")
            screenshot = tmp_path / "dashboard.png"
            page.screenshot(path=str(screenshot))
            assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            if os.environ.get(SCREENSHOT_ENV):
                shutil.copy(screenshot, os.environ[SCREENSHOT_ENV])

            # The cancel button cancels: the worker stops the job and the page shows it.
            page.click("#cancel")
            page.wait_for_selector('h1 [data-status="cancelled"]', timeout=60_000)
            assert get(client, f"/v1/jobs/{job['id']}")["status"] == "cancelled"
            assert page.is_disabled("#cancel")

            # Compare: both jobs side by side, the trained one's evaluation curve drawn.
            page.goto(f"{base}/#/compare?ids={job['id']},{other['id']}")
            page.wait_for_selector("#compare-table")
            headers = page.locator("#compare-table thead th").all_text_contents()
            assert any(f"job {job['id']}" in h for h in headers) and any(
                f"job {other['id']}" in h for h in headers
            )
            assert points(page, "eval accuracy") >= 3
            assert errors == []
        finally:
            page.close()
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(60)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_dashboard_asks_for_a_key_and_shows_what_it_may_see(
    settings_factory: Any, tmp_path: Path, glue_data: Path, db_url: str, browser: Any
) -> None:
    settings = observe_settings(
        settings_factory, tmp_path, glue_data, db_url, api_keys=["alice-key", "bob-key"]
    )
    with live_api(settings) as client:
        base = str(client.base_url).rstrip("/")
        mine = client.post(
            "/v1/jobs", json={"spec": TINY_SPEC}, headers={"Authorization": "Bearer alice-key"}
        )
        theirs = client.post(
            "/v1/jobs", json={"spec": TINY_SPEC}, headers={"Authorization": "Bearer bob-key"}
        )
        # What the page reads of a job is its owner's alone (404 for any other key).
        bob = {"Authorization": "Bearer bob-key"}
        for path in ("", "/logs", "/artifacts", "/artifacts/logs", "/stream", "/metrics", "/checkpoints"):
            assert client.get(f"/v1/jobs/{mine.json()['id']}{path}", headers=bob).status_code == 404, path
        # Prometheus scrapes with a key too, once keys are configured.
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers=bob).status_code == 200
        page = browser.new_page()
        errors = console_errors(page)
        page.goto(f"{base}/")
        page.wait_for_selector("#key-dialog[open]")
        page.fill("#key-input", "not-a-key")
        page.click("#key-form button")
        page.wait_for_function("() => document.querySelector('#key-error').textContent.includes('refused')")
        page.fill("#key-input", "alice-key")
        page.click("#key-form button")
        page.wait_for_selector(f'tr[data-job="{mine.json()["id"]}"]')
        assert page.locator(f'tr[data-job="{theirs.json()["id"]}"]').count() == 0
        # Kept for the session: a reload asks no more.
        page.reload()
        page.wait_for_selector(f'tr[data-job="{mine.json()["id"]}"]')
        assert not page.is_visible("#key-dialog")
        # Only the refused requests' own 401s reach the console.
        assert [e for e in errors if UNAUTHORIZED_LOAD not in e] == []
        assert errors
        page.close()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_dashboard_shows_a_sweep_as_a_table_of_medians_and_spreads(
    settings_factory: Any, tmp_path: Path, glue_data: Path, db_url: str, browser: Any
) -> None:
    """Two learning rates × three seeds; a worker's rows are written the way a worker writes them
    (claim, one evaluation, finish) so the statistics are known; one job is left queued."""
    settings = observe_settings(settings_factory, tmp_path, glue_data, db_url)
    db = Database(settings.database_url)
    accuracies = [0.70, 0.80, 0.72, 0.60, 0.64]  # the sixth job (2e-4, seed 3) stays queued
    with live_api(settings) as client:
        base = str(client.base_url).rstrip("/")
        created = client.post(
            "/v1/sweeps",
            json={
                "spec": {k: v for k, v in TINY_SPEC.items() if k not in ("seed", "learning_rate")},
                "seeds": [1, 2, 3],
                "grid": {"learning_rate": [1e-4, 2e-4]},
            },
        )
        assert created.status_code == 201, created.text
        sweep = created.json()
        for job_id, accuracy in zip(sweep["job_ids"], accuracies, strict=False):
            with db.session() as session:
                claim = claimed(session, job_id)
                rows = [
                    MetricRow(1.0, 5, "eval", "accuracy", accuracy),
                    MetricRow(1.0, 5, "eval", "loss", 0.5),
                ]
                jobs_repo.add_metrics(session, job_id=job_id, rows=rows, best_metric="accuracy", claim=claim)
                jobs_repo.finish_job(session, claim=claim, status=JobStatus.succeeded)
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        errors = console_errors(page)
        try:
            page.goto(f"{base}/")
            page.click("#nav-sweeps")
            page.wait_for_selector(f'tr[data-sweep="{sweep["id"]}"] [data-status="running"]')
            page.click(f'a[href="#/sweeps/{sweep["id"]}"]')
            page.wait_for_selector("#sweep-table tr.config-row")
            rows = page.locator("#sweep-table tr.config-row")
            assert rows.count() == 2
            first, second = rows.nth(0).inner_text(), rows.nth(1).inner_text()
            # Medians over the seeds that evaluated, with their spread (± std · min–max).
            assert "learning_rate=0.0001" in first and "3 / 3" in first
            assert "0.7200" in first and f"± {statistics.stdev([0.70, 0.80, 0.72]):.4f}" in first
            assert "0.7000–0.8000" in first
            assert "learning_rate=0.0002" in second and "2 / 3" in second and "0.6200" in second
            # The winner is the configuration with the best median of the task's main metric.
            assert page.locator("#sweep-table tr.config-row[data-winner]").count() == 1
            assert page.get_attribute("#sweep-table tr.config-row >> nth=0", "data-winner") is not None
            assert "winner" in first and "winner" not in second
            assert "0.7200" in (page.text_content("#sweep-winner") or "")

            # Cancelling the sweep cancels the job that was still queued.
            page.click("#cancel-sweep")
            page.wait_for_selector('h1 [data-status="cancelled"], h1 [data-status="succeeded"]')
            assert get(client, f"/v1/jobs/{sweep['job_ids'][5]}")["status"] == "cancelled"
            assert page.is_disabled("#cancel-sweep")
            assert errors == []
        finally:
            page.close()
            db.dispose()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_pages_load_nothing_from_elsewhere_under_their_policy(
    settings_factory: Any, db_url: str, browser: Any
) -> None:
    """The dashboard and Swagger UI (/docs) come with a Content-Security-Policy that allows this origin
    only, and still work under it: the browser reports no violation, and no request leaves the API."""
    with live_api(settings_factory(db_url)) as client:
        base = str(client.base_url).rstrip("/")
        for path in ("/", "/docs"):
            policy = client.get(path).headers["content-security-policy"]
            assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
        page = browser.new_page()
        errors = console_errors(page)
        requested: list[str] = []
        page.on("request", lambda request: requested.append(request.url))
        page.goto(f"{base}/docs")
        page.wait_for_selector("#operations-jobs-create_job_v1_jobs_post", timeout=30_000)
        page.goto(f"{base}/")
        page.wait_for_selector("#jobs-table, #status-filter", timeout=30_000)
        assert errors == []
        assert requested and all(url.startswith((base, "data:")) for url in requested), requested
