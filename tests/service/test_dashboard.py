"""The dashboard in a real headless browser (Debian's chromium, driven by Playwright).

Against a live API and a real worker: the list loads and filters, a training job's curves get
points while it trains, the cancel button cancels, an API key is asked for once and scopes what the
page shows. Against one live API for the module, with rows written the way a job's process writes
them (claimed, fenced): a running job's page draws every row there is and then each new one, its
log is text as a terminal shows it, every figure says whether it is the best or the final (latest)
evaluation, "Submit again" queues nothing before it is confirmed and honours an edit, compare shows
the hyperparameters that differ and overlays training loss, a sweep and its jobs link both ways. The
browser logs no error and no Content-Security-Policy violation in any of them."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import statistics
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest

from shared import jobs_repo
from shared.core.config import Settings
from shared.core.db import Database
from shared.core.migrate import upgrade
from shared.core.tables import JobStatus
from shared.jobs_repo import Claim, MetricRow
from tests.support.dbutil import claimed
from tests.support.e2e import get, live_api, start_worker, submit, wait_for
from tests.support.kit import settings_under
from tests.support.observe_helpers import TINY_SPEC, observe_settings

pytestmark = pytest.mark.e2e

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
STREAM = re.compile(r"/v1/jobs/\d+/stream")
REFUSED_LOAD = "Failed to load resource: the server responded with a status of"
UNAUTHORIZED_LOAD = "the server responded with a status of 401"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One chromium for the module's tests (each gets a page of its own)."""
    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: `make test` installs it (apt-get install chromium)"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        yield launched
        launched.close()


def console_errors(page: Any) -> list[str]:
    """What the page logs as an error; chromium logs each Content-Security-Policy violation so."""
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(f"page error: {error}"))
    return errors


def points(page: Any, chart: str) -> int:
    return int(page.get_attribute(f'[data-chart="{chart}"]', "data-points") or 0)


def wait_points(page: Any, chart: str, count: int) -> None:
    page.wait_for_function(
        '([chart, n]) => Number(document.querySelector(`[data-chart="${chart}"]`)?.dataset.points) === n',
        arg=[chart, count],
    )


@dataclass
class Service:
    """The module's live API (SQLite: what the page shows does not depend on the database)."""

    client: httpx.Client
    base: str
    db: Database
    settings: Settings


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, models_dir: Path, glue_data: Path) -> Iterator[Service]:
    root = tmp_path_factory.mktemp("dashboard")
    url = f"sqlite:///{root / 'gluejobs.db'}"
    db = Database(url)
    upgrade(db)
    settings = settings_under(root, url, models_dir=models_dir, glue_dir=glue_data)
    try:
        with live_api(settings) as client:
            yield Service(client, str(client.base_url).rstrip("/"), db, settings)
    finally:
        db.dispose()


class Tab(NamedTuple):
    page: Any
    errors: list[str]


@pytest.fixture
def tab(browser: Any) -> Iterator[Tab]:
    page = browser.new_page(viewport={"width": 1440, "height": 1200})
    errors = console_errors(page)
    try:
        yield Tab(page, errors)
    finally:
        page.close()


# Rows written as a job's process writes them: under the claim its worker took.


def running_job(service: Service, spec: dict[str, Any]) -> Claim:
    """A job submitted and claimed (running), as a worker claims it."""
    job = submit(service.client, spec)
    with service.db.session() as session:
        return claimed(session, job["id"])


def write_rows(service: Service, claim: Claim, rows: Iterable[MetricRow]) -> None:
    """One write per split and step, as the process reports each logging step and evaluation."""
    for _, group in itertools.groupby(rows, key=lambda row: (row.split, row.step)):
        with service.db.session() as session:
            jobs_repo.add_metrics(
                session, job_id=claim.job_id, rows=list(group), best_metric="accuracy", claim=claim
            )


def finish(service: Service, claim: Claim) -> None:
    with service.db.session() as session:
        assert jobs_repo.finish_job(session, claim=claim, status=JobStatus.succeeded)


def training(steps: Iterable[int], steps_per_epoch: int = 10) -> list[MetricRow]:
    return [
        MetricRow(step / steps_per_epoch, step, "train", name, value)
        for step in steps
        for name, value in (("loss", 1.0 / step), ("learning_rate", 1e-3 * (1 - step / 100)))
    ]


def evaluation(step: int, accuracy: float, steps_per_epoch: int = 10) -> list[MetricRow]:
    epoch = step / steps_per_epoch
    return [MetricRow(epoch, step, "eval", "accuracy", accuracy), MetricRow(epoch, step, "eval", "loss", 0.5)]


def append_log(service: Service, claim: Claim, data: bytes) -> None:
    """What the job's process prints goes to its attempt's log (worker/fleet/supervisor.py)."""
    log = service.settings.job_dir(claim.job_id) / "logs" / f"attempt-{claim.attempt}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as handle:
        handle.write(data)


def fact(page: Any, key: str) -> str:
    return page.text_content(f'.facts [data-fact="{key}"]') or ""


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


def test_a_running_jobs_page_draws_every_row_there_is_and_its_log_as_a_terminal_shows_it(
    service: Service, tab: Tab
) -> None:
    page, errors = tab
    claim = running_job(service, {**TINY_SPEC, "seed": 11})
    write_rows(service, claim, training(range(1, 6)))
    append_log(
        service,
        claim,
        b"\x1b[1mloading\x1b[0m tiny-bert\n"
        b"Map:   0%|          | 0/64\rMap:  50%|#####     | 32/64\rMap: 100%|##########| 64/64\n"
        b"<b>not bold</b> & <script>window.injected = 1</script>\n"
        b"\x1b]0;a title\x07step 1/9\x1b[K\rstep 3/9",  # a progress bar mid-line
    )
    # The live stream held back (as a slow proxy or a long log to replay held it): the page still shows
    # every row there is, the same rows its header's figures come from.
    held: list[Any] = []
    page.route(STREAM, lambda route: held.append(route))
    page.goto(f"{service.base}/#/jobs/{claim.job_id}")
    wait_points(page, "loss", 5)
    assert points(page, "learning_rate") == 5
    assert "train loss (step 5)" in fact(page, "train-loss") and "0.2000" in fact(page, "train-loss")
    # The log as text, as a terminal shows it: escapes gone, each rewritten line's last state.
    page.wait_for_function("() => document.querySelector('#log').textContent.endsWith('step 3/9')")
    assert page.text_content("#log") == (
        "loading tiny-bert\nMap: 100%|##########| 64/64\n"
        "<b>not bold</b> & <script>window.injected = 1</script>\nstep 3/9"
    )
    assert page.evaluate("document.querySelector('#log').children.length") == 0
    assert page.evaluate("window.injected") is None
    assert len(held) == 1

    # The stream let through: rows and log lines written from now on arrive while the job runs.
    held[0].continue_()
    page.unroute(STREAM)
    write_rows(service, claim, [*training(range(6, 11)), *evaluation(10, 0.75)])
    append_log(service, claim, b"\rstep 9/9\n\x1b[32mevaluating\x1b[0m\n")
    wait_points(page, "loss", 10)
    wait_points(page, "eval accuracy", 1)
    page.wait_for_function(
        "() => document.querySelector('#log').textContent.endsWith('step 9/9\\nevaluating')"
    )
    # A worse evaluation: the latest and the best, each said to be which.
    write_rows(service, claim, evaluation(20, 0.70))
    wait_points(page, "eval accuracy", 2)
    page.wait_for_function(
        "() => document.querySelector('[data-fact=\"latest\"]')?.textContent.includes('0.7000')"
    )
    assert fact(page, "latest") == "accuracy (latest evaluation)0.7000"
    assert fact(page, "best") == "accuracy (best evaluation)0.7500 · step 10"

    # Once it has ended, the newest evaluation is the final one, here and in the list.
    finish(service, claim)
    page.wait_for_selector('h1 [data-status="succeeded"]')
    page.wait_for_selector('.facts [data-fact="final"]')
    assert fact(page, "final") == "accuracy (final evaluation)0.7000"
    page.goto(f"{service.base}/#/")
    cell = page.locator(f'tr[data-job="{claim.job_id}"] td.metric')
    assert cell.text_content() == "accuracy: final 0.7000 · best 0.7500"
    assert errors == []


def test_submit_again_is_a_form_to_edit_and_queues_only_once_confirmed(service: Service, tab: Tab) -> None:
    page, errors = tab
    claim = running_job(service, {**TINY_SPEC, "seed": 12})
    finish(service, claim)
    original = get(service.client, f"/v1/jobs/{claim.job_id}")

    def queued() -> int:
        return len(get(service.client, "/v1/jobs", limit=100)["data"])

    before = queued()
    page.goto(f"{service.base}/#/jobs/{claim.job_id}")
    page.click("#submit-again")
    # The spec as it would be submitted, which the API's dry run accepts; nothing queued.
    page.wait_for_selector("#resubmit[open] #resubmit-ok")
    assert json.loads(page.input_value("#resubmit-spec")) == original["spec"]
    assert queued() == before

    # An edit the API refuses: its 422 in the form, naming the field; still nothing queued.
    page.fill("#resubmit-spec", json.dumps({**original["spec"], "learning_rate": -1}))
    page.click("#resubmit-next")
    page.wait_for_function(
        "() => document.querySelector('#resubmit-error').textContent.startsWith('spec.learning_rate')"
    )
    assert not page.is_visible("#resubmit-confirm")
    page.fill("#resubmit-spec", '{"learning_rate": ')
    page.click("#resubmit-check")
    page.wait_for_function(
        "() => document.querySelector('#resubmit-error').textContent.includes('not valid JSON')"
    )

    # An accepted edit: the changes listed to confirm, and only the confirmation queues the job.
    page.fill(
        "#resubmit-spec", json.dumps({**original["spec"], "learning_rate": 5e-4, "max_eval_samples": 16})
    )
    page.click("#resubmit-next")
    page.wait_for_selector("#resubmit-confirm:not([hidden])")
    assert page.locator("#resubmit-changes li").all_text_contents() == [
        "learning_rate: 0.001 → 0.0005",
        "max_eval_samples: 32 → 16",
    ]
    assert queued() == before
    page.click("#resubmit-yes")
    page.wait_for_function(
        "(id) => location.hash.startsWith('#/jobs/') && location.hash !== `#/jobs/${id}`", arg=claim.job_id
    )
    new_id = int(page.evaluate("location.hash").rsplit("/", 1)[1])
    created = get(service.client, f"/v1/jobs/{new_id}")
    assert queued() == before + 1
    assert created["spec"] == {**original["spec"], "learning_rate": 5e-4, "max_eval_samples": 16}
    assert created["metadata"]["resubmitted_from"] == str(claim.job_id)
    page.wait_for_selector(f'h1:has-text("Job {new_id}") [data-status="queued"]')
    # The refused dry run's own 422 is the one thing the console shows.
    assert errors == [f"{REFUSED_LOAD} 422 (Unprocessable Entity)"]
    # Nothing is left queued for the module's next test to claim.
    assert service.client.post(f"/v1/jobs/{new_id}/cancel").status_code == 200


def test_compare_shows_the_hyperparameters_that_differ_and_overlays_training_loss(
    service: Service, tab: Tab
) -> None:
    page, errors = tab
    first = running_job(service, {**TINY_SPEC, "seed": 21})
    write_rows(service, first, [*training(range(1, 5)), *evaluation(4, 0.60)])
    finish(service, first)
    second = running_job(service, {**TINY_SPEC, "seed": 22, "learning_rate": 5e-4, "weight_decay": 0.01})
    write_rows(service, second, [*training(range(1, 7)), *evaluation(3, 0.70), *evaluation(6, 0.65)])
    finish(service, second)
    page.goto(f"{service.base}/#/compare?ids={first.job_id},{second.job_id}")
    page.wait_for_selector("#compare-table")
    fields = page.locator("#compare-params tbody tr").evaluate_all("rows => rows.map(r => r.dataset.field)")
    assert fields == ["learning_rate", "seed", "weight_decay"]
    assert page.locator('#compare-params tr[data-field="weight_decay"] td').all_text_contents() == [
        "weight_decay",
        "0",
        "0.01",
    ]
    # Training loss of both overlaid (4 + 6 points), beside the evaluation curves.
    assert points(page, "train loss") == 10
    assert points(page, "eval accuracy") == 3
    assert page.locator('[data-chart="train loss"] .u-legend').text_content().count("job ") == 2
    final = page.locator(
        '#compare-table tr[data-metric="accuracy"][data-point="final"] td'
    ).all_text_contents()
    best = page.locator('#compare-table tr[data-metric="accuracy"][data-point="best"] td').all_text_contents()
    assert final == ["accuracy (final evaluation)", "0.6000", "0.6500"]
    assert best == ["accuracy (best evaluation)", "0.6000 · step 4", "0.7000 · step 3"]
    assert errors == []


def test_a_sweep_shows_medians_and_spreads_at_the_best_and_the_final_evaluation_and_links_its_jobs(
    service: Service, tab: Tab
) -> None:
    """Two learning rates × three seeds; each job's rows are written as its process writes them (two
    evaluations: the best, then a final one 0.1 lower) so the statistics are known; one job is left
    queued."""
    page, errors = tab
    accuracies = [0.70, 0.80, 0.72, 0.60, 0.64]  # at the best evaluation; the sixth job stays queued
    created = service.client.post(
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
        with service.db.session() as session:
            claim = claimed(session, job_id)
        write_rows(service, claim, [*evaluation(5, accuracy), *evaluation(10, accuracy - 0.1)])
        finish(service, claim)
    page.goto(f"{service.base}/")
    page.click("#nav-sweeps")
    page.wait_for_selector(f'tr[data-sweep="{sweep["id"]}"] [data-status="running"]')
    page.click(f'a[href="#/sweeps/{sweep["id"]}"]')
    page.wait_for_selector("#sweep-best tr.config-row")
    rows = page.locator("#sweep-best tr.config-row")
    assert rows.count() == 2
    first, second = rows.nth(0).inner_text(), rows.nth(1).inner_text()
    # Medians over the seeds that evaluated, with their spread (± std · min–max).
    assert "learning_rate=0.0001" in first and "3 / 3" in first
    assert "0.7200" in first and f"± {statistics.stdev([0.70, 0.80, 0.72]):.4f}" in first
    assert "0.7000–0.8000" in first
    assert "learning_rate=0.0002" in second and "2 / 3" in second and "0.6200" in second
    # The same configurations at the final evaluation, said to be that.
    assert "accuracy (best) ★" in (page.text_content("#sweep-best thead") or "")
    assert "accuracy (final) ★" in (page.text_content("#sweep-final thead") or "")
    final_first = page.locator("#sweep-final tr.config-row").nth(0).inner_text()
    assert "0.6200" in final_first and "0.6000–0.7000" in final_first
    # The winner: the best median of the task's main metric at the best evaluation, which it says.
    assert page.locator("#sweep-best tr.config-row[data-winner]").count() == 1
    assert page.get_attribute("#sweep-best tr.config-row >> nth=0", "data-winner") is not None
    assert "winner" in first and "winner" not in second
    assert page.text_content("#sweep-winner") == (
        "Winner on accuracy, ranked at the best evaluation: learning_rate=0.0001 — median 0.7200 at the "
        "best evaluation, 0.6200 at the final evaluation, over 3 seed(s)."
    )

    # The sweep links to each of its jobs, and a job back to its sweep.
    linked = page.locator("#sweep-best a.job-link").evaluate_all(
        "links => links.map(a => Number(a.dataset.job))"
    )
    assert linked == sweep["job_ids"]
    page.click(f'#sweep-best a.job-link[data-job="{sweep["job_ids"][0]}"]')
    page.wait_for_selector(f'a#job-sweep[href="#/sweeps/{sweep["id"]}"]')
    page.click("#job-sweep")
    page.wait_for_selector("#sweep-best tr.config-row")

    # Cancelling the sweep cancels the job that was still queued.
    page.click("#cancel-sweep")
    page.wait_for_selector('h1 [data-status="cancelled"]')
    assert get(service.client, f"/v1/jobs/{sweep['job_ids'][5]}")["status"] == "cancelled"
    assert page.is_disabled("#cancel-sweep")
    assert page.locator("#sweep-best tr.config-row").count() == 2  # its statistics stay on the page
    assert errors == []


def test_a_search_shows_its_best_trial_its_trials_and_the_pruned_ones_in_its_chart(
    service: Service, tab: Tab
) -> None:
    """Three trials at once; two finish with known accuracies, the third's first evaluation is below
    their median and the API's search driver prunes it; the page shows the best trial, the trials
    table with where the pruned one stopped, and the objective over trials with the pruned one apart."""
    page, errors = tab
    created = service.client.post(
        "/v1/searches",
        json={
            # Ten steps planned a trial: what pruning saved is known.
            "spec": {**{k: v for k, v in TINY_SPEC.items() if k != "learning_rate"}, "max_train_steps": 10},
            "space": {"learning_rate": {"type": "float", "low": 1e-5, "high": 1e-3, "log": True}},
            "n_trials": 3,
            "parallelism": 3,
            "sampler": {"type": "random"},
            "pruner": {"type": "median", "n_startup_trials": 2},
        },
    )
    assert created.status_code == 201, created.text
    search = created.json()
    first, second, third = search["job_ids"]
    claims = {}
    for job_id in search["job_ids"]:
        with service.db.session() as session:
            claims[job_id] = claimed(session, job_id)
    for job_id, accuracy in ((first, 0.80), (second, 0.70)):
        write_rows(service, claims[job_id], [*evaluation(5, accuracy), *evaluation(10, accuracy + 0.05)])
        finish(service, claims[job_id])
    # Judged when it is reported: once the two others have completed (the pruner's startup trials).
    wait_for(lambda: get(service.client, f"/v1/searches/{search['id']}")["trial_counts"]["complete"] == 2)
    write_rows(service, claims[third], evaluation(5, 0.40))
    wait_for(lambda: get(service.client, f"/v1/jobs/{third}")["status"] == "cancelling", timeout_s=60)
    with service.db.session() as session:  # its worker stops it
        assert jobs_repo.finish_job(session, claim=claims[third], status=JobStatus.cancelled)
    wait_for(
        lambda: get(service.client, f"/v1/searches/{search['id']}")["status"] == "succeeded", timeout_s=60
    )

    # At 1400 × 900, the jobs list marks the pruned trial so, with where it stopped and its search.
    page.set_viewport_size(WINDOW)
    page.goto(f"{service.base}/")
    pruned_job = f'tr[data-job="{third}"]'
    page.wait_for_selector(f"{pruned_job} [data-pruned]")
    assert page.text_content(f"{pruned_job} .status") == "pruned"
    assert page.text_content(f"{pruned_job} .stopped") == "trial 2, stopped at step 5 (evaluation 1)"
    assert page.get_attribute(f"{pruned_job} a.search-link", "href") == f"#/searches/{search['id']}"
    assert page.locator(f'tr[data-job="{first}"] [data-pruned]').count() == 0
    fits_the_window(page, "#jobs")
    page.screenshot(path="/tmp/dashboard-jobs-pruned-1400.png", full_page=True)
    page.click(f"{pruned_job} a.search-link")
    page.wait_for_selector("#search-space")
    page.goto(f"{service.base}/")
    page.click("#nav-searches")
    page.wait_for_selector(f'tr[data-search="{search["id"]}"] [data-status="succeeded"]')
    page.click(f'a[href="#/searches/{search["id"]}"]')
    page.wait_for_selector("#trials tr.trial-row")
    assert page.locator("#trials tr.trial-row").count() == 3
    states = page.locator("#trials tr.trial-row").evaluate_all("rows => rows.map(r => r.dataset.state)")
    assert states == ["complete", "complete", "pruned"]
    pruned_row = page.locator('#trials tr.trial-row[data-state="pruned"]').inner_text()
    assert "evaluation 1 (epoch 0.5, step 5): 0.4000" in pruned_row
    best_row = page.locator("#trials tr.trial-row[data-best]").inner_text()
    assert "best" in best_row and "0.8500" in best_row
    assert (page.text_content("#search-best") or "").startswith(
        f"Best: trial 0 (job {first}), learning_rate="
    )
    # complete trials (2), the best so far (2) and the pruned trial at the value it was stopped with (1)
    wait_points(page, "objective over trials", 5)
    wait_points(page, "objective at each evaluation", 5)
    # The space searched, and the compute pruning saved: 5 of the pruned trial's 10 planned steps.
    assert page.text_content('#search-space li[data-field="learning_rate"]') == (
        "learning_rate: 0.00001 … 0.001, log scale"
    )
    assert page.text_content("#search-savings") == (
        "Pruning saved 5 of 30 optimizer steps (16.7 %): 1 trial(s) stopped early, 25 steps run."
    )
    fits_the_window(page, "#trials")
    page.screenshot(path="/tmp/dashboard-search-1400.png", full_page=True)
    page.click(f'#trials a.job-link[data-job="{third}"]')
    page.wait_for_url(f"**#/jobs/{third}")
    page.wait_for_selector(f'a#job-search[href="#/searches/{search["id"]}"]')
    assert fact(page, "pruned").startswith(
        f"prunedby search {search['id']} at step 5 (evaluation 1): accuracy"
    )
    assert errors == []


WINDOW = {"width": 1400, "height": 900}  # issue 35 item 6: the jobs table overflowed a 1400 px window


def fits_the_window(page: Any, table: str) -> None:
    """The table is no wider than the page's content box, and the page does not scroll sideways."""
    widths = page.evaluate(
        """(table) => ({table: document.querySelector(table).scrollWidth,
            main: document.querySelector('main').clientWidth,
            page: document.documentElement.scrollWidth, window: window.innerWidth})""",
        table,
    )
    assert widths["table"] <= widths["main"] and widths["page"] <= widths["window"], widths


def test_a_jobs_page_names_its_uploaded_files_its_mapping_and_each_checkpoints_figures(
    service: Service, tab: Tab, tmp_path: Path
) -> None:
    """At 1400 × 900: the job page names an uploaded file by its name (not file-1) and shows the column
    mapping; a checkpoint saved between evaluations shows the figures at its step; the jobs list fits."""
    page, errors = tab
    page.set_viewport_size(WINDOW)
    with (service.settings.glue_dir / "SST-2" / "train.tsv").open(encoding="utf-8") as handle:
        rows = [line.rstrip("\n").split("\t") for line in itertools.islice(handle, 1, 81)]
    reviews = "review,sentiment\n" + "".join(
        f'"{text.strip()}",{"positive" if label == "1" else "negative"}\n' for text, label in rows
    )
    name = "customer-reviews-2026-q3-with-a-long-descriptive-name.csv"
    mapping = {"text_column": "review", "label_column": "sentiment"}
    uploaded = service.client.post("/v1/files", files={"file": (name, reviews.encode())}, data=mapping)
    assert uploaded.status_code == 201, uploaded.text
    file_id = uploaded.json()["id"]
    spec = {k: v for k, v in TINY_SPEC.items() if k != "task_name"}
    claim = running_job(
        service,
        {
            **spec,
            **mapping,
            "train_file": file_id,
            "validation_file": file_id,
            "save_strategy": "steps",
            "save_steps": 8,
        },
    )
    write_rows(service, claim, [*training(range(1, 9)), *evaluation(5, 0.625)])
    with service.db.session() as session:  # saved at step 8, between evaluations: no metrics of its own
        jobs_repo.add_checkpoint(
            session,
            job_id=claim.job_id,
            step=8,
            epoch=0.8,
            path=str(service.settings.job_dir(claim.job_id) / "checkpoints" / "checkpoint-8"),
            metrics={},
            claim=claim,
        )

    page.goto(f"{service.base}/#/jobs/{claim.job_id}")
    page.wait_for_selector('.facts [data-fact="mapping"]')
    assert fact(page, "task") == f"task / files{name}"
    assert file_id not in fact(page, "task")
    assert fact(page, "files").startswith(f"data filestrain: {name} (")
    assert f"validation: {name}" in fact(page, "files")
    assert fact(page, "mapping") == "column mappingtext ← review, label ← sentiment"
    page.wait_for_selector('#checkpoints tr[data-step="8"]')
    cell = page.text_content('#checkpoints tr[data-step="8"] td.checkpoint-metrics') or ""
    assert cell == "train loss 0.1250 · last evaluation, step 5: accuracy 0.6250, loss 0.5000", cell
    page.screenshot(path="/tmp/dashboard-job-1400.png", full_page=True)

    page.goto(f"{service.base}/#/")
    page.wait_for_selector(f'tr[data-job="{claim.job_id}"]')
    assert name in (page.text_content(f'tr[data-job="{claim.job_id}"]') or "")
    fits_the_window(page, "#jobs")
    page.screenshot(path="/tmp/dashboard-jobs-1400.png", full_page=True)
    assert errors == []
    finish(service, claim)


def test_the_pages_load_nothing_from_elsewhere_under_their_policy(service: Service, tab: Tab) -> None:
    """The dashboard and Swagger UI (/docs) come with a Content-Security-Policy that allows this origin
    only, and still work under it: the browser reports no violation, and no request leaves the API."""
    page, errors = tab
    for path in ("/", "/docs"):
        policy = service.client.get(path).headers["content-security-policy"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.goto(f"{service.base}/docs")
    page.wait_for_selector("#operations-jobs-create_job_v1_jobs_post", timeout=30_000)
    page.goto(f"{service.base}/")
    page.wait_for_selector("#jobs-body tr", timeout=30_000)
    assert errors == []
    assert requested and all(url.startswith((service.base, "data:")) for url in requested), requested


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_dashboard_shows_owners_the_queue_by_owner_and_why_a_queued_job_waits(
    settings_factory: Any, tmp_path: Path, glue_data: Path, db_url: str, browser: Any
) -> None:
    keys = {"alice": "alice-dash-key-0001", "bob": "bob-dash-key-00002", "root": "root-dash-key-0003"}
    settings = observe_settings(
        settings_factory,
        tmp_path,
        glue_data,
        db_url,
        api_keys=[f"alice={keys['alice']}", f"bob={keys['bob']}"],
        admin_keys=[f"root={keys['root']}"],
    )
    as_ = {owner: {"Authorization": f"Bearer {key}"} for owner, key in keys.items()}
    with live_api(settings) as client:
        base = str(client.base_url).rstrip("/")
        quota = client.patch("/v1/owners/alice", json={"max_devices": 0}, headers=as_["root"])
        assert quota.status_code == 200, quota.text
        ids = {}
        for owner in ("alice", "alice", "bob"):  # no worker: every job stays queued
            created = client.post("/v1/jobs", json={"spec": TINY_SPEC}, headers=as_[owner])
            assert created.status_code == 201, created.text
            ids.setdefault(owner, []).append(created.json()["id"])
        jobs = {j["id"]: j for j in client.get("/v1/jobs", headers=as_["root"]).json()["data"]}
        owners = {o["name"]: o for o in client.get("/v1/owners", headers=as_["root"]).json()["data"]}
        assert jobs[ids["alice"][0]]["waiting_for"]["reason"] == "quota"
        assert jobs[ids["bob"][0]]["waiting_for"]["reason"] == "devices"

        page = browser.new_page(viewport={"width": 1440, "height": 1200})
        errors = console_errors(page)
        # The admin's key in the tab's storage before the page loads: no key dialog.
        page.add_init_script(f"sessionStorage.setItem('gluejobs.apiKey', {json.dumps(keys['root'])})")
        try:
            page.goto(f"{base}/")
            page.wait_for_selector('#owners-body tr[data-owner="bob"]')
            # Each job's owner, and why each queued job waits, as the API says.
            for job_id, job in jobs.items():
                row = f'tr[data-job="{job_id}"]'
                assert page.text_content(f"{row} td.owner") == job["owner"]
                assert page.text_content(f"{row} .waiting") == job["waiting_for"]["message"]
            # The queue by owner: the API's figures, beside the quota where there is one.
            cells = {
                name: {
                    col: page.text_content(f'#owners-body tr[data-owner="{name}"] [data-col="{col}"]')
                    for col in ("running", "devices", "queued", "device-hours", "storage")
                }
                for name in ("alice", "bob")
            }
            alice, bob = owners["alice"], owners["bob"]
            assert cells["alice"]["devices"] == f"{alice['devices_in_use']} / 0"
            assert (
                cells["alice"]["queued"] == f"2 / {alice['quota']['max_queued']}"
                and alice["queued_jobs"] == 2
            )
            assert cells["bob"]["queued"] == f"1 / {bob['quota']['max_queued']}"
            assert (
                cells["bob"]["devices"] == f"{bob['devices_in_use']}" and bob["quota"]["max_devices"] is None
            )
            assert cells["alice"]["running"] == cells["bob"]["running"] == "0"
            assert cells["alice"]["device-hours"] == "0.00"
            assert cells["alice"]["storage"] == cells["bob"]["storage"] == "0 B"  # nothing stored yet

            # The job page says whose job it is and what it waits for.
            first = ids["alice"][0]
            page.click(f'a[href="#/jobs/{first}"]')
            page.wait_for_selector('.facts [data-fact="waiting"]')
            assert fact(page, "owner").endswith("alice")
            assert fact(page, "waiting") == f"waiting for{jobs[first]['waiting_for']['message']}"
            assert errors == []
        finally:
            page.close()
