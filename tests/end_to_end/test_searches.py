"""Hyperparameter searches (shared/searches, /v1/searches) on SQLite and Postgres.

Trials are moved along with the repository calls a worker makes (claim, metric rows, finish) and the
driver is stepped by hand, so that every report, prune and ending can be pinned. The last test
runs the same paths with real worker processes, real API processes (one stopped mid-search) and
real SST-2 rows.
"""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from gluejobs_server import stack
from service.main import create_app
from shared import jobs_repo
from shared.core.config import Settings
from shared.core.db import Database
from shared.core.tables import Job, JobStatus, Search, SearchTrial
from shared.jobs_repo import MetricRow
from shared.searches import store
from shared.searches.config import FloatRange
from shared.searches.driver import drive_once
from shared.searches.optimizer import COMPLETE, Optimizer, TrialRecord
from shared.webhooks import endpoints as webhook_endpoints
from tests.support.dbutil import claimed, count_rows
from tests.support.e2e import LOOPBACK_URL, REPO, all_metrics, api_process, live_api, start_worker, wait_for

SST2 = {"model_name_or_path": "tiny-bert", "task_name": "sst2", "max_eval_samples": 40}
LR = {"type": "float", "low": 1e-5, "high": 1e-3, "log": True}
DRIVER = "test-driver"


@pytest.fixture
def client(settings: Settings, db: Database) -> TestClient:
    return TestClient(create_app(settings, db), base_url=LOOPBACK_URL)


def create(client: TestClient, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/searches", json={"spec": SST2, "space": {"learning_rate": LR}, **body})
    assert response.status_code == 201, response.text
    search: dict[str, Any] = response.json()
    return search


def search_of(client: TestClient, search_id: int) -> dict[str, Any]:
    response = client.get(f"/v1/searches/{search_id}")
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


def evaluate(db: Database, job_id: int, values: list[float], *, finish: JobStatus | None = None) -> None:
    """What a worker does: claim the job, write one evaluation per epoch (steps 2, 4 …), maybe finish."""
    with db.session() as session:
        claim = claimed(session, job_id)
        for epoch, value in enumerate(values, start=1):
            rows = [MetricRow(float(epoch), 2 * epoch, "eval", "accuracy", value)]
            jobs_repo.add_metrics(session, job_id=job_id, rows=rows, best_metric="accuracy", claim=claim)
        if finish is not None:
            jobs_repo.finish_job(session, claim=claim, status=finish)


def finish_running(db: Database, job_id: int, status: JobStatus) -> None:
    """The job's worker records how it ended (a cancelled job: its worker stopped it)."""
    with db.engine.connect() as connection:
        worker_id, attempt = connection.execute(
            select(Job.worker_id, Job.attempts).where(Job.id == job_id)
        ).one()
    with db.session() as session:
        jobs_repo.finish_job(session, claim=jobs_repo.Claim(job_id, worker_id, attempt), status=status)


def drive(db: Database, settings: Settings) -> None:
    drive_once(db, settings, driver_id=DRIVER)


def test_a_search_queues_its_first_trials_as_ordinary_jobs(client: TestClient) -> None:
    search = create(client, n_trials=5, parallelism=2, metadata={"project": "lr"})
    assert search["status"] == "running"
    assert search["objective"] == {"metric": "accuracy", "direction": "maximize"}
    assert search["sampler"]["type"] == "tpe" and search["pruner"]["type"] == "median"
    assert len(search["job_ids"]) == 2 and search["trial_counts"]["running"] == 2
    assert "learning_rate" not in search["spec"]
    seeds = set()
    for trial in search["trials"]:
        job = client.get(f"/v1/jobs/{trial['job_id']}").json()
        lr = trial["params"]["learning_rate"]
        assert 1e-5 <= lr <= 1e-3 and job["spec"]["learning_rate"] == lr
        assert job["status"] == "queued"
        assert job["metadata"] == {
            "project": "lr",
            "search_id": str(search["id"]),
            "search_trial": trial["number"],
            "search_configuration": f"learning_rate={lr} seed={job['spec']['seed']}",
        }
        seeds.add(job["spec"]["seed"])
    assert len(seeds) == 1  # the trials differ only in the searched values
    listed = client.get("/v1/searches").json()
    assert [s["id"] for s in listed["data"]] == [search["id"]] and listed["data"][0]["trials"] is None
    assert len(client.get("/v1/jobs").json()["data"]) == 2  # visible where jobs are


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (
            {"space": {"learning_rate": {"type": "float", "low": 1e-3, "high": 1e-5}}},
            "space.learning_rate.float",
        ),
        (
            {"space": {"learning_rate": {"type": "float", "low": 0, "high": 1e-3, "log": True}}},
            "space.learning_rate.float",
        ),
        ({"space": {"seed": {"type": "int", "low": 0, "high": 9}}}, "space.seed"),
        (
            {"space": {"model_name_or_path": {"type": "categorical", "choices": ["a", "b"]}}},
            "space.model_name_or_path",
        ),
        ({"space": {"learning_rat": LR}}, "space.learning_rat"),
        ({"space": {"max_eval_samples": {"type": "int", "low": 1, "high": 9}}}, "space.max_eval_samples"),
        ({"space": {"num_warmup_steps": {"type": "int", "low": -5, "high": 9}}}, "space.num_warmup_steps"),
        ({"space": {}}, "space"),
        ({"objective": {"metric": "f1"}}, "objective.metric"),
        ({"pruner": {"type": "hyperband"}}, "pruner.type"),
        ({"n_trials": 0}, "n_trials"),
    ],
)
def test_a_search_that_cannot_run_is_refused_naming_the_field(
    client: TestClient, db: Database, body: dict[str, Any], field: str
) -> None:
    response = client.post("/v1/searches", json={"spec": SST2, "space": {"learning_rate": LR}, **body})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field, response.json()
    assert count_rows(db, Search) == 0 and count_rows(db, Job) == 0


def test_the_median_pruner_stops_a_trial_behind_the_others_by_the_cancel_path(
    client: TestClient, db: Database, settings: Settings
) -> None:
    search = create(client, n_trials=4, parallelism=2, pruner={"type": "median", "n_startup_trials": 2})
    first, second = search["job_ids"]
    evaluate(db, first, [0.80, 0.85], finish=JobStatus.succeeded)
    evaluate(db, second, [0.70, 0.90], finish=JobStatus.succeeded)
    drive(db, settings)  # both complete; two more trials are asked for
    found = search_of(client, search["id"])
    assert [t["state"] for t in found["trials"]] == ["complete", "complete", "running", "running"]
    assert [t["value"] for t in found["trials"][:2]] == [0.85, 0.90]  # each trial's best evaluation
    assert found["best"]["number"] == 1 and found["best"]["value"] == 0.90
    third, fourth = found["job_ids"][2:]

    evaluate(db, third, [0.50])  # below the median (0.75) of the others' first evaluation
    evaluate(db, fourth, [0.80])
    drive(db, settings)
    job = client.get(f"/v1/jobs/{third}").json()
    assert job["status"] == "cancelling" and job["error_code"] == "pruned"
    assert "at evaluation 1 (epoch 1, step 2): accuracy 0.5" in job["error"]
    events = client.get(f"/v1/jobs/{third}/events").json()["data"]
    pruned = next(e for e in events if e["data"] and "pruned" in e["data"])
    assert pruned["data"]["pruned"] == {
        "evaluation": 1,
        "epoch": 1.0,
        "step": 2,
        "metric": "accuracy",
        "value": 0.5,
        "pruner": "median",
    }
    assert "pruned by search" in pruned["message"]
    assert client.get(f"/v1/jobs/{fourth}").json()["status"] == "running"  # above the median: goes on

    finish_running(db, third, JobStatus.cancelled)  # its worker stopped it
    job = client.get(f"/v1/jobs/{third}").json()
    assert job["status"] == "cancelled" and job["error_code"] == "pruned" and "pruned" in job["error"]
    with db.session() as session:
        jobs_repo.add_metrics(
            session,
            job_id=fourth,
            rows=[MetricRow(2.0, 4, "eval", "accuracy", 0.95)],
            best_metric="accuracy",
            claim=jobs_repo.Claim(fourth, "w", 1),
        )
    finish_running(db, fourth, JobStatus.succeeded)
    drive(db, settings)
    found = search_of(client, search["id"])
    assert found["status"] == "succeeded" and found["finished_at"] is not None
    assert found["trial_counts"] == {"running": 0, "complete": 3, "pruned": 1, "failed": 0}
    pruned_trial = found["trials"][2]
    assert pruned_trial["state"] == "pruned" and pruned_trial["pruned"]["evaluation"] == 1
    assert pruned_trial["intermediate"] == {"1": 0.5}
    assert found["best"] == {
        "number": 3,
        "job_id": fourth,
        "params": found["trials"][3]["params"],
        "value": 0.95,
    }
    assert client.post(f"/v1/searches/{search['id']}/cancel").status_code == 409


def test_a_median_pruners_warmup_spares_that_many_first_evaluations(
    client: TestClient, db: Database, settings: Settings
) -> None:
    """n_warmup_steps=1: never pruned at the first evaluation, however far behind (evaluations count
    from 1 here, Optuna's steps from 0: the driver shifts it), and pruned at the second."""
    search = create(
        client,
        n_trials=3,
        parallelism=1,
        sampler={"type": "random"},
        pruner={"type": "median", "n_startup_trials": 1, "n_warmup_steps": 1},
    )
    evaluate(db, search["job_ids"][0], [0.80, 0.85], finish=JobStatus.succeeded)
    drive(db, settings)
    second = search_of(client, search["id"])["job_ids"][1]
    evaluate(db, second, [0.10])
    drive(db, settings)
    assert client.get(f"/v1/jobs/{second}").json()["status"] == "running"
    with db.session() as session:
        rows = [MetricRow(2.0, 4, "eval", "accuracy", 0.20)]
        jobs_repo.add_metrics(
            session, job_id=second, rows=rows, best_metric="accuracy", claim=jobs_repo.Claim(second, "w", 1)
        )
    drive(db, settings)
    job = client.get(f"/v1/jobs/{second}").json()
    assert job["status"] == "cancelling" and "at evaluation 2" in job["error"], job["error"]


def test_successive_halving_prunes_at_its_rungs(client: TestClient, db: Database, settings: Settings) -> None:
    search = create(
        client,
        n_trials=2,
        parallelism=1,
        sampler={"type": "random"},
        pruner={"type": "asha", "min_resource": 1, "reduction_factor": 2},
    )
    evaluate(db, search["job_ids"][0], [0.9], finish=JobStatus.succeeded)
    drive(db, settings)
    with db.engine.connect() as connection:
        attrs = connection.scalar(select(SearchTrial.system_attrs).where(SearchTrial.number == 0))
    assert attrs == {"completed_rung_0": 0.9}  # kept for the next steps' studies
    second = search_of(client, search["id"])["job_ids"][1]
    evaluate(db, second, [0.4])  # not in the top half at rung 0
    drive(db, settings)
    job = client.get(f"/v1/jobs/{second}").json()
    assert job["status"] == "cancelling" and job["error_code"] == "pruned" and "asha pruner" in job["error"]


def announce_schedule(db: Database, job_id: int, steps: int) -> None:
    """What the training loop says as it starts (worker/training/reporter.py's log_schedule)."""
    with db.engine.connect() as connection:
        worker_id, attempt = connection.execute(
            select(Job.worker_id, Job.attempts).where(Job.id == job_id)
        ).one()
    with db.session() as session:
        jobs_repo.add_event(
            session,
            job_id=job_id,
            message=f"training: 1 epochs, {steps} optimizer steps, batch 8 × 1 processes × 1 accumulation",
            data={"num_epochs": 1, "max_train_steps": steps, "warmup_steps": 0},
            claim=jobs_repo.Claim(job_id, worker_id, attempt),
        )


def test_a_pruned_trials_job_names_its_search_and_where_it_stopped_and_the_search_what_pruning_saved(
    client: TestClient, db: Database, settings: Settings
) -> None:
    search = create(
        client,
        n_trials=2,
        parallelism=1,
        sampler={"type": "random"},
        pruner={"type": "asha", "min_resource": 1, "reduction_factor": 2},
    )
    first = search["job_ids"][0]
    evaluate(db, first, [0.9])
    announce_schedule(db, first, 8)
    finish_running(db, first, JobStatus.succeeded)
    drive(db, settings)
    second = search_of(client, search["id"])["job_ids"][1]
    evaluate(db, second, [0.4])  # step 2 of 8: not in the top half at rung 0
    announce_schedule(db, second, 8)
    drive(db, settings)
    stopped = {
        "search_id": search["id"],
        "trial": 1,
        "evaluation": 1,
        "epoch": 1.0,
        "step": 2,
        "metric": "accuracy",
        "value": 0.4,
        "pruner": "asha",
    }
    job = client.get(f"/v1/jobs/{second}").json()
    assert job["status"] == "cancelling" and job["search_id"] == search["id"] and job["pruned"] == stopped
    listed = {j["id"]: j for j in client.get("/v1/jobs").json()["data"]}
    assert listed[second]["pruned"] == stopped
    assert listed[first]["search_id"] == search["id"] and listed[first]["pruned"] is None
    finish_running(db, second, JobStatus.cancelled)
    drive(db, settings)
    found = search_of(client, search["id"])
    assert found["status"] == "succeeded"
    # 8 + 8 steps planned; the complete trial ran its 8, the pruned one 2 of them.
    assert found["savings"] == {
        "pruned_trials": 1,
        "steps_planned": 16,
        "steps_run": 10,
        "steps_saved": 6,
        "saved_share": 0.375,
        "trials_unknown": 0,
    }


def test_cancelling_a_search_cancels_its_trials(client: TestClient, db: Database, settings: Settings) -> None:
    search = create(client, n_trials=6, parallelism=2)
    evaluate(db, search["job_ids"][0], [0.6])  # running
    response = client.post(f"/v1/searches/{search['id']}/cancel")
    assert response.status_code == 202, response.text
    statuses = [client.get(f"/v1/jobs/{i}").json()["status"] for i in search["job_ids"]]
    assert statuses == ["cancelling", "cancelled"]
    drive(db, settings)
    assert search_of(client, search["id"])["status"] == "running"  # a trial is still stopping
    finish_running(db, search["job_ids"][0], JobStatus.cancelled)
    drive(db, settings)
    found = search_of(client, search["id"])
    assert found["status"] == "cancelled" and len(found["trials"]) == 2  # no trial asked after the cancel
    assert found["trial_counts"]["failed"] == 2 and found["best"] is None
    assert client.post(f"/v1/searches/{search['id']}/cancel").status_code == 409


def test_a_finished_search_is_announced_to_the_owners_webhooks(
    client: TestClient, db: Database, settings: Settings
) -> None:
    with db.session() as session:
        endpoint = webhook_endpoints.create_endpoint(
            session, owner=None, url="http://hooks.example.org/", event_types=["search.finished"]
        )
    search = create(client, n_trials=2, parallelism=1)
    cancelled = client.post(f"/v1/searches/{search['id']}/cancel")  # its one trial was only queued
    assert cancelled.status_code in (200, 202), cancelled.text
    drive(db, settings)
    drive(db, settings)  # announced once, however often the driver looks again
    assert search_of(client, search["id"])["status"] == "cancelled"
    with db.session() as session:
        [delivery] = webhook_endpoints.list_deliveries(session, endpoint_id=endpoint.id)[0]
    assert delivery.payload["type"] == "search.finished"
    assert delivery.payload["data"]["search_id"] == search["id"]
    assert delivery.payload["data"]["status"] == "cancelled"


def test_search_finished_carries_the_best_trials_parameters_value_and_job(
    client: TestClient, db: Database, settings: Settings
) -> None:
    """A webhook's reader can act on the winner at once: the best trial's number, job, parameters and
    objective value, the same as GET /v1/searches/{id} says (issue 35 item 6)."""
    with db.session() as session:
        endpoint = webhook_endpoints.create_endpoint(
            session, owner=None, url="http://hooks.example.org/", event_types=["search.finished"]
        )
    search = create(client, n_trials=2, parallelism=2, pruner={"type": "none"})
    first, second = search["job_ids"]
    evaluate(db, first, [0.6, 0.7], finish=JobStatus.succeeded)
    evaluate(db, second, [0.9, 0.8], finish=JobStatus.succeeded)
    drive(db, settings)
    found = search_of(client, search["id"])
    assert found["status"] == "succeeded"
    with db.session() as session:
        [delivery] = webhook_endpoints.list_deliveries(session, endpoint_id=endpoint.id)[0]
    data = delivery.payload["data"]
    assert data["best"] == found["best"]
    assert data["best"]["job_id"] == second and data["best"]["number"] == 1
    assert data["best"]["value"] == 0.9  # its best evaluation, not its last
    assert (
        data["best"]["params"] == found["trials"][1]["params"] and "learning_rate" in data["best"]["params"]
    )
    assert data["objective"] == found["objective"] == {"metric": "accuracy", "direction": "maximize"}
    assert data["best_trial"] == 1 and data["status"] == "succeeded"


def test_the_best_configuration_reruns_over_seeds(
    client: TestClient, db: Database, settings: Settings
) -> None:
    search = create(client, n_trials=1, parallelism=1, pruner={"type": "none"})
    assert client.post(f"/v1/searches/{search['id']}/seeds", json={"seeds": [0, 1]}).status_code == 409
    evaluate(db, search["job_ids"][0], [0.7, 0.8], finish=JobStatus.succeeded)
    drive(db, settings)
    response = client.post(f"/v1/searches/{search['id']}/seeds", json={"seeds": [0, 1, 2]})
    assert response.status_code == 201, response.text
    seeds = response.json()["seeds"]
    assert seeds["seeds"] == [0, 1, 2] and len(seeds["job_ids"]) == 3 and seeds["median"] is None
    best_lr = search["trials"][0]["params"]["learning_rate"]
    for job_id, value in zip(seeds["job_ids"], [0.81, 0.79, 0.85], strict=True):
        job = client.get(f"/v1/jobs/{job_id}").json()
        assert job["spec"]["learning_rate"] == best_lr and job["sweep_id"] == seeds["sweep_id"]
        evaluate(db, job_id, [value - 0.1, value], finish=JobStatus.succeeded)
    seeds = search_of(client, search["id"])["seeds"]
    assert seeds["values"] == [0.81, 0.79, 0.85] and seeds["median"] == statistics.median([0.81, 0.79, 0.85])
    assert seeds["status"] == "succeeded"
    assert client.post(f"/v1/searches/{search['id']}/seeds", json={"seeds": [4]}).status_code == 409


def test_one_driver_at_a_time_holds_a_search(client: TestClient, db: Database) -> None:
    search = create(client, n_trials=2, parallelism=1)
    with db.session() as session:
        assert store.take_lease(session, search_id=search["id"], driver_id="a", lease_s=60)
        assert store.take_lease(session, search_id=search["id"], driver_id="a", lease_s=60)  # renewed
        assert not store.take_lease(session, search_id=search["id"], driver_id="b", lease_s=60)
        store.release_leases(session, driver_id="a")  # its API process stopped
        assert store.take_lease(session, search_id=search["id"], driver_id="b", lease_s=-1)  # at once
        assert store.take_lease(session, search_id=search["id"], driver_id="a", lease_s=60)  # b's ran out


@pytest.mark.parametrize("sampler", [{"type": "random"}, {"type": "tpe", "n_startup_trials": 2}])
def test_a_rebuilt_study_asks_what_the_first_would_have(sampler: dict[str, Any]) -> None:
    """The driver rebuilds the study from rows at every step: the parameters drawn must depend on the
    history only, so that a search driven by another process draws what this one would have."""
    space = {"learning_rate": FloatRange(type="float", low=1e-5, high=1e-3, log=True)}
    history = [
        TrialRecord(i, {"learning_rate": lr}, COMPLETE, value, {1: value})
        for i, (lr, value) in enumerate([(1e-4, 0.8), (3e-4, 0.9), (2e-5, 0.6)])
    ]

    def asked() -> list[float]:
        optimizer = Optimizer(
            space=space,
            direction="maximize",
            sampler={**sampler, "n_startup_trials": 2},
            pruner={"type": "none"},
            seed=7,
            trials=history,
        )
        return [optimizer.ask()[1]["learning_rate"] for _ in range(3)]

    drawn = asked()
    assert drawn == asked() and len(set(drawn)) == 3
    assert all(math.log(1e-5) <= math.log(lr) <= math.log(1e-3) for lr in drawn)


ALICE, BOB = "alice=alice-key-0123456789abcdef", "bob=bob-key-0123456789abcdef"


def test_trials_are_the_owners_jobs_counted_against_its_queue(settings_factory, db_url: str) -> None:  # type: ignore[no-untyped-def]
    settings = settings_factory(db_url, api_keys=[ALICE, BOB], default_max_queued=1)
    db = Database(settings.database_url)
    client = TestClient(create_app(settings, db), base_url=LOOPBACK_URL)
    client.headers["Authorization"] = "Bearer " + ALICE.split("=", 1)[1]
    body = {"spec": SST2, "space": {"learning_rate": LR}, "parallelism": 2}
    response = client.post("/v1/searches", json=body)
    assert response.status_code == 429 and response.json()["error"]["code"] == "over_quota"
    assert count_rows(db, Search) == 0 and count_rows(db, Job) == 0  # nothing half-stored
    search = create(client, n_trials=3, parallelism=1)
    assert client.get(f"/v1/jobs/{search['job_ids'][0]}").json()["owner"] == "alice"
    bob = {"Authorization": "Bearer " + BOB.split("=", 1)[1]}
    assert client.get(f"/v1/searches/{search['id']}", headers=bob).status_code == 404
    assert client.get("/v1/searches", headers=bob).json()["data"] == []
    evaluate(db, search["job_ids"][0], [0.7], finish=JobStatus.succeeded)
    assert client.post("/v1/jobs", json={"spec": SST2}).status_code == 201  # the queue is full again
    drive(db, settings)
    found = search_of(client, search["id"])
    assert len(found["trials"]) == 1 and "waiting for room in the queue" in found["note"]
    db.dispose()


# ---------------------------------------------------------------------------------------------------
# End to end: real worker processes, real API processes (one stopped mid-search), real SST-2 rows
# ---------------------------------------------------------------------------------------------------

# Small enough to run in minutes on a loaded two-core machine; an evaluation after every step, so
# that a trial the pruner stops still has most of its steps left when its worker stops it.
E2E_SPEC = {
    "model_name_or_path": "tiny-bert",
    "task_name": "sst2",
    "max_train_samples": 64,
    "max_eval_samples": 32,
    "per_device_train_batch_size": 8,
    "per_device_eval_batch_size": 32,
    "num_train_epochs": 3,
    "eval_strategy": "steps",
    "eval_steps": 1,
    "logging_steps": 8,
    "save_strategy": "no",
    "seed": 3,
}
E2E_STEPS = 24
E2E_TRIALS = 8


# On both databases with real workers and a real API restart (issue 25 asks for the end-to-end run on
# each): the driver's lock and trial rows differ between them.
@pytest.mark.e2e
def test_a_search_prunes_trials_and_survives_an_api_restart(
    settings_factory, db_url: str, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Eight trials over the learning rate, two at a time on two workers; the median pruner stops
    trials whose first evaluation's loss is above the median of the finished ones'. The API process
    that drives the search is stopped once some trials have ended, and another one finishes it."""
    settings = settings_factory(
        db_url, search_poll_s=0.1, heartbeat_s=0.2, poll_interval_s=0.3, cancel_grace_s=5
    )
    body = {
        "spec": E2E_SPEC,
        "space": {"learning_rate": {"type": "float", "low": 1e-5, "high": 1e-1, "log": True}},
        "objective": {"metric": "loss"},  # continuous: no ties at the median, unlike 64 rows' accuracy
        "n_trials": E2E_TRIALS,
        "parallelism": 2,
        "sampler": {"type": "random"},
        "pruner": {"type": "median", "n_startup_trials": 2},
    }
    workers = [start_worker(settings, log=tmp_path / f"worker-{i}.log") for i in range(2)]
    try:
        with api_process(settings, log=tmp_path / "api-1.log") as (client, _):
            response = client.post("/v1/searches", json=body)
            assert response.status_code == 201, response.text
            search_id = response.json()["id"]
            assert response.json()["objective"] == {"metric": "loss", "direction": "minimize"}
            wait_for(lambda: _ended(client, search_id) >= 3, timeout_s=600)
        ended_before = _ended_trials(settings, search_id)
        assert len(ended_before) < E2E_TRIALS  # stopped mid-search
        with api_process(settings, log=tmp_path / "api-2.log") as (client, _):
            search = wait_for(lambda: _finished(client, search_id), timeout_s=900)
            jobs = {t["job_id"]: client.get(f"/v1/jobs/{t['job_id']}").json() for t in search["trials"]}
            events = {i: client.get(f"/v1/jobs/{i}/events").json()["data"] for i in jobs}
            evaluated = {i: [r["step"] for r in all_metrics(client, i) if r["split"] == "eval"] for i in jobs}
    finally:
        for worker in workers:
            stack.stop(worker, grace_s=20)

    assert search["status"] == "succeeded", search
    trials = search["trials"]
    assert len(trials) == E2E_TRIALS and search["trial_counts"]["running"] == 0
    pruned = [t for t in trials if t["state"] == "pruned"]
    assert pruned, [(t["state"], t["intermediate"]) for t in trials]
    for trial in pruned:
        job = jobs[trial["job_id"]]
        assert job["status"] == "cancelled" and job["error_code"] == "pruned"
        where = trial["pruned"]
        assert where["evaluation"] < E2E_STEPS  # pruned before its last evaluation
        assert (
            f"at evaluation {where['evaluation']} (epoch {where['epoch']:g}, step {where['step']})"
            in job["error"]
        )
        said = [e for e in events[job["id"]] if e["data"] and e["data"].get("pruned")]
        assert said and said[0]["data"]["pruned"]["value"] == where["value"]
    # Its worker stopped it before the end. A trial pruned a few evaluations before its last may
    # still reach it on a loaded machine (a step of this tiny model is shorter than the cancel's way
    # from the search to the job): one that stopped early at least, or the pruner saved nothing.
    # A trial pruned in the first half has half its steps to stop in: it must have.
    for trial in pruned:
        if trial["pruned"]["evaluation"] <= E2E_STEPS // 2:
            assert max(evaluated[trial["job_id"]]) < E2E_STEPS, (trial["pruned"], len(trial["intermediate"]))
    stopped_early = [t for t in pruned if max(evaluated[t["job_id"]]) < E2E_STEPS]
    assert stopped_early, [(t["pruned"], len(t["intermediate"])) for t in pruned]
    complete = [t for t in trials if t["state"] == "complete"]
    best = min(complete, key=lambda t: (t["value"], t["number"]))
    assert search["best"] == {
        "number": best["number"],
        "job_id": best["job_id"],
        "params": best["params"],
        "value": best["value"],
    }
    for trial in complete:  # the value is the trial's best evaluation, as its job's rows say
        assert trial["value"] == min(trial["intermediate"].values())
        assert len(trial["intermediate"]) == E2E_STEPS
        assert jobs[trial["job_id"]]["status"] == "succeeded"


def _ended(client: httpx.Client, search_id: int) -> int:
    counts = client.get(f"/v1/searches/{search_id}").json()["trial_counts"]
    return int(counts["complete"] + counts["pruned"] + counts["failed"])


def _ended_trials(settings: Settings, search_id: int) -> list[int]:
    db = Database(settings.database_url)
    try:
        with db.engine.connect() as connection:
            query = select(SearchTrial.number).where(
                SearchTrial.search_id == search_id, SearchTrial.state != "running"
            )
            return list(connection.scalars(query))
    finally:
        db.dispose()


def _finished(client: httpx.Client, search_id: int) -> dict[str, Any] | None:
    search: dict[str, Any] = client.get(f"/v1/searches/{search_id}").json()
    return search if search["status"] != "running" else None


# e2e: a live API and a `gluejobs` process per command (out of `make test-fast`, like the rest here).
# One database: the commands speak HTTP; the search's rows and lock are the test above's, on both.
@pytest.mark.e2e
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_command_line_creates_shows_lists_and_cancels_a_search(settings: Settings, db: Database) -> None:
    """`gluejobs search create|show|ls|cancel` against a live API. The test drives the search itself:
    the API's own driver is off, or it could hold the search's lease when the test's turn comes."""
    with live_api(settings.model_copy(update={"search_driver": False})) as client:

        def cli(*args: str) -> str:
            done = subprocess.run(
                [sys.executable, "-m", "gluejobs.cli", "search", *args, "--url", str(client.base_url)],
                capture_output=True,
                text=True,
                timeout=120,
                cwd=REPO,
            )
            assert done.returncode == 0, done.stderr
            return done.stdout

        created = cli(
            "create", "--model_name_or_path", "tiny-bert", "--task_name", "sst2",
            "--max_eval_samples", "40", "--space", "learning_rate=float:1e-5:1e-3:log",
            "--space", "per_device_train_batch_size=choice:16,32",
            "--trials", "4", "--parallelism", "2", "--sampler", "random", "--pruner", "asha",
        )  # fmt: skip
        search_id = int(created.split()[1])
        search = search_of(client, search_id)
        assert search["space"] == {
            "learning_rate": {"type": "float", "low": 1e-5, "high": 1e-3, "log": True},
            "per_device_train_batch_size": {"type": "categorical", "choices": [16, 32]},
        }
        assert search["sampler"]["type"] == "random" and search["pruner"]["type"] == "asha"
        evaluate(db, search["job_ids"][0], [0.75], finish=JobStatus.succeeded)
        drive(db, settings)
        shown = cli("show", str(search_id))
        assert f"search {search_id}: running" in shown and "accuracy (maximize)" in shown
        assert "best: trial 0" in shown and "0.7500" in shown and "complete" in shown
        assert str(search_id) in cli("ls")
        assert f"search {search_id}: running" in cli("cancel", str(search_id))  # its trials were queued
        assert [
            client.get(f"/v1/jobs/{i}").json()["status"] for i in search_of(client, search_id)["job_ids"]
        ] == [
            "succeeded",
            "cancelled",
            "cancelled",
        ]
        drive(db, settings)
        assert f"search {search_id}: cancelled" in cli("show", str(search_id))
