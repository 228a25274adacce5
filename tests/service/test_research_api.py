"""Sweeps, the leaderboard and reruns through the HTTP API, on SQLite and Postgres.

Jobs are moved along with the repository calls a worker makes (claim, metric rows, finish), so
the values are chosen and every statistic, rank and flag can be pinned exactly; the same paths
with a real worker are test_research_end_to_end's.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from fastapi.testclient import TestClient

from service.main import create_app
from shared import jobs_repo
from shared.core.config import Settings
from shared.core.db import Database
from shared.core.tables import Job, JobStatus, Sweep
from shared.jobs_repo import MetricRow
from tests.support.dbutil import claimed, count_rows
from tests.support.e2e import LOOPBACK_URL

SST2 = {"model_name_or_path": "tiny-bert", "task_name": "sst2", "max_eval_samples": 40}


@pytest.fixture
def client(settings: Settings, db: Database) -> TestClient:
    return TestClient(create_app(settings, db), base_url=LOOPBACK_URL)


def create_sweep(client: TestClient, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/sweeps", json=body)
    assert response.status_code == 201, response.text
    sweep: dict[str, Any] = response.json()
    return sweep


def run_job(
    db: Database,
    job_id: int,
    evals: list[dict[str, float]],
    *,
    metric: str = "accuracy",
    status: JobStatus = JobStatus.succeeded,
    environment: dict[str, Any] | None = None,
) -> None:
    """What a worker does: claim the job, record its environment, write one evaluation per epoch
    (steps 2, 4 …), finish."""
    with db.session() as session:
        claim = claimed(session, job_id)
        if environment is not None:
            jobs_repo.set_environment(session, job_id=job_id, environment=environment, claim=claim)
        for epoch, values in enumerate(evals, start=1):
            rows = [MetricRow(float(epoch), 2 * epoch, "eval", name, value) for name, value in values.items()]
            jobs_repo.add_metrics(session, job_id=job_id, rows=rows, best_metric=metric, claim=claim)
        jobs_repo.finish_job(session, claim=claim, status=status, result={"trainable_params": 1000 + job_id})


def sst2_baseline(glue_data: Path, rows: int | None) -> float:
    labels = pd.read_csv(glue_data / "SST-2" / "dev.tsv", sep="\t", quoting=csv.QUOTE_NONE, dtype=str)[
        "label"
    ]
    labels = labels.head(rows) if rows else labels
    return float(labels.value_counts().max() / len(labels))


# ---------------------------------------------------------------------------------------------------
# Sweeps
# ---------------------------------------------------------------------------------------------------


def test_a_sweep_queues_one_job_per_combination(client: TestClient) -> None:
    sweep = create_sweep(
        client,
        spec={**SST2, "apply_lora": True},
        seeds=[3, 1],
        grid={"learning_rate": [1e-4, "2e-4"], "lora_r": [4, 8]},
        metadata={"paper": "lora"},
        priority=5,
    )

    jobs = [client.get(f"/v1/jobs/{i}").json() for i in sweep["job_ids"]]
    assert (sweep["status"], sweep["seeds"], sweep["main_metric"]) == ("queued", [3, 1], "accuracy")
    assert sweep["job_counts"]["queued"] == 8
    assert [(j["spec"]["learning_rate"], j["spec"]["lora_r"], j["spec"]["seed"]) for j in jobs] == [
        (lr, r, seed) for lr in (1e-4, 2e-4) for r in (4, 8) for seed in (3, 1)
    ]
    assert all(j["priority"] == 5 and j["sweep_id"] == sweep["id"] for j in jobs)
    assert jobs[0]["metadata"] == {
        "paper": "lora",
        "sweep_id": str(sweep["id"]),
        "sweep_configuration": "learning_rate=0.0001 lora_r=4 seed=3",
    }
    listed = client.get("/v1/sweeps").json()
    assert [s["id"] for s in listed["data"]] == [sweep["id"]] and listed["data"][0]["configurations"] is None


def test_a_sweep_without_seeds_gives_every_configuration_one_seed(client: TestClient) -> None:
    sweep = create_sweep(client, spec=SST2, grid={"learning_rate": [1e-4, 2e-4]})

    seeds = {client.get(f"/v1/jobs/{i}").json()["spec"]["seed"] for i in sweep["job_ids"]}
    assert len(sweep["job_ids"]) == 2 and seeds == set(sweep["seeds"]) and len(seeds) == 1


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        (
            {"spec": SST2, "seeds": [1, 2], "grid": {"learning_rate": [1e-4, -1]}},
            "grid.learning_rate",
            "combination learning_rate=-1 seed=1: must be greater than 0, not -1",
        ),
        (
            {"spec": SST2, "seeds": [1], "grid": {"warmup_ratio": [0.1]}, "extra": 1},
            "extra",
            "unknown field",
        ),
        (
            {"spec": {**SST2, "num_warmup_steps": 5}, "seeds": [1], "grid": {"warmup_ratio": [0.0, 0.1]}},
            "grid.warmup_ratio",
            "combination warmup_ratio=0.1 seed=1: give num_warmup_steps or warmup_ratio, not both",
        ),
        (
            {"spec": {**SST2, "train_file": "missing.csv"}, "seeds": [1, 2]},
            "spec.train_file",
            "combination seed=1: train_file 'missing.csv' not found",
        ),
        ({"spec": SST2, "grid": {"colour": ["red"]}}, "grid.colour", "'colour' is not a job spec field"),
        ({"spec": SST2, "grid": {"seed": [1, 2]}}, "grid.seed", "seeds go in `seeds`"),
        ({"spec": {**SST2, "seed": 4}, "seeds": [1]}, "spec.seed", "not a seed in the spec as well"),
        ({"spec": SST2, "seeds": [1, 1]}, "seeds", "seeds repeat"),
        ({"spec": SST2}, "seeds", "a sweep needs seeds, a grid, or both"),
        (
            {
                "spec": SST2,
                "seeds": list(range(11)),
                "grid": {"learning_rate": [1e-4 * i for i in range(1, 11)]},
            },
            "grid",
            "the sweep would make 110 jobs; at most 100",
        ),
        (
            {"spec": SST2, "seeds": [1], "grid": {"learning_rate": [1e-4, "0.0001"]}},
            "grid",
            "are the same job",
        ),
    ],
)
def test_a_sweep_with_a_bad_combination_is_refused_whole(
    client: TestClient, db: Database, body: dict[str, Any], field: str, message: str
) -> None:
    response = client.post("/v1/sweeps", json=body)

    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["field"] == field and message in error["message"]
    assert count_rows(db, Sweep) == 0 and count_rows(db, Job) == 0


def test_sweep_statistics_over_seeds_at_the_best_and_final_evaluation(
    client: TestClient, db: Database
) -> None:
    sweep = create_sweep(client, spec=SST2, seeds=[1, 2, 3], grid={"learning_rate": [1e-4, 2e-4]})
    ids = sweep["job_ids"]
    # (best, final) accuracy per job; losses are final > best; the third seed of 2e-4 fails.
    runs = {
        ids[0]: (0.70, 0.65),
        ids[1]: (0.80, 0.75),
        ids[2]: (0.72, 0.72),
        ids[3]: (0.60, 0.55),
        ids[4]: (0.64, 0.63),
    }
    for job_id, (best, final) in runs.items():
        run_job(db, job_id, [{"accuracy": best, "loss": 0.5}, {"accuracy": final, "loss": 0.4}])
        if job_id == ids[1]:
            assert client.get(f"/v1/sweeps/{sweep['id']}").json()["status"] == "running"
    run_job(db, ids[5], [{"accuracy": 0.99, "loss": 0.1}], status=JobStatus.failed)

    read = client.get(f"/v1/sweeps/{sweep['id']}").json()

    assert read["status"] == "failed" and read["job_counts"]["succeeded"] == 5
    first, second = read["configurations"]
    assert (first["configuration"], first["job_ids"], first["seeds"]) == (
        {"learning_rate": 1e-4},
        ids[:3],
        [1, 2, 3],
    )
    assert (first["seeds_evaluated"], second["seeds_evaluated"]) == (3, 2)  # the failed job does not count
    assert first["best"]["eval"]["accuracy"] == {
        "median": 0.72,
        "mean": pytest.approx(statistics.fmean([0.70, 0.80, 0.72])),
        "std": pytest.approx(statistics.stdev([0.70, 0.80, 0.72])),
        "min": 0.70,
        "max": 0.80,
        "n": 3,
    }
    assert first["final"]["eval"]["accuracy"]["median"] == 0.72
    assert first["best"]["eval"]["loss"]["median"] == 0.5 and first["final"]["eval"]["loss"]["max"] == 0.4
    assert second["best"]["eval"]["accuracy"] == {
        "median": pytest.approx(0.62),
        "mean": pytest.approx(0.62),
        "std": pytest.approx(statistics.stdev([0.60, 0.64])),
        "min": 0.60,
        "max": 0.64,
        "n": 2,
    }
    assert read["winner"] == {
        "configuration": {"learning_rate": 1e-4},
        "metric": "accuracy",
        "median": 0.72,
        "std": pytest.approx(statistics.stdev([0.70, 0.80, 0.72])),
        "seeds_evaluated": 3,
        "job_ids": ids[:3],
    }


def test_cancelling_a_sweep_cancels_what_is_left(client: TestClient, db: Database) -> None:
    sweep = create_sweep(client, spec=SST2, seeds=[1, 2, 3, 4])
    done, running, *queued = sweep["job_ids"]
    run_job(db, done, [{"accuracy": 0.7}])
    with db.session() as session:
        claim = claimed(session, running)

    response = client.post(f"/v1/sweeps/{sweep['id']}/cancel")

    assert response.status_code == 202  # one job was running: its worker stops it
    statuses = {i: client.get(f"/v1/jobs/{i}").json()["status"] for i in sweep["job_ids"]}
    assert statuses == {
        done: "succeeded",
        running: "cancelling",
        queued[0]: "cancelled",
        queued[1]: "cancelled",
    }
    assert response.json()["status"] == "running" and response.json()["cancel_requested_at"] is not None
    with db.session() as session:  # the worker sees the request and stops the job
        jobs_repo.finish_job(session, claim=claim, status=JobStatus.cancelled)
    assert client.get(f"/v1/sweeps/{sweep['id']}").json()["status"] == "cancelled"
    again = client.post(f"/v1/sweeps/{sweep['id']}/cancel")
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"
    assert client.post("/v1/sweeps/999/cancel").status_code == 404


def test_sweeps_belong_to_their_key(settings: Settings, db: Database) -> None:
    keyed = settings.model_copy(update={"api_keys": ["alice-key", "bob-key"], "admin_keys": ["root-key"]})
    client = TestClient(create_app(keyed, db), base_url=LOOPBACK_URL)
    alice = {"Authorization": "Bearer alice-key"}
    bob = {"Authorization": "Bearer bob-key"}
    created = client.post("/v1/sweeps", json={"spec": SST2, "seeds": [1, 2]}, headers=alice)
    assert created.status_code == 201
    sweep_id = created.json()["id"]

    assert client.get(f"/v1/sweeps/{sweep_id}", headers=bob).status_code == 404
    assert client.post(f"/v1/sweeps/{sweep_id}/cancel", headers=bob).status_code == 404
    assert client.get("/v1/sweeps", headers=bob).json()["data"] == []
    assert (
        client.get(f"/v1/sweeps/{sweep_id}", headers={"Authorization": "Bearer root-key"}).status_code == 200
    )
    assert client.get("/v1/sweeps").status_code == 401
    assert client.post(f"/v1/sweeps/{sweep_id}/cancel", headers=alice).status_code == 200


# ---------------------------------------------------------------------------------------------------
# The leaderboard
# ---------------------------------------------------------------------------------------------------


def submit(client: TestClient, spec: dict[str, Any]) -> int:
    response = client.post("/v1/jobs", json={"spec": spec})
    assert response.status_code == 201, response.text
    job_id: int = response.json()["id"]
    return job_id


def test_the_leaderboard_ranks_sweeps_and_jobs_next_to_the_majority_baseline(
    client: TestClient, db: Database, glue_data: Path
) -> None:
    baseline = sst2_baseline(glue_data, 40)
    strong = submit(client, {**SST2, "learning_rate": 3e-4, "seed": 1})
    run_job(db, strong, [{"accuracy": baseline + 0.15}, {"accuracy": baseline + 0.10}])
    sweep = create_sweep(client, spec=SST2, seeds=[1, 2], grid={"learning_rate": [1e-4, 2e-4]})
    sweep_values = [baseline + 0.08, baseline + 0.12, baseline + 0.02, baseline + 0.04]
    for job_id, value in zip(sweep["job_ids"], sweep_values, strict=True):
        run_job(db, job_id, [{"accuracy": value}])
    chance = submit(client, {**SST2, "learning_rate": 1e-5, "seed": 1})
    run_job(db, chance, [{"accuracy": baseline + 0.005}])
    rerun = client.post(f"/v1/jobs/{strong}/rerun").json()["id"]  # a check of `strong`, not an entry
    run_job(db, rerun, [{"accuracy": baseline + 0.15}, {"accuracy": baseline + 0.10}])
    failed = submit(client, {**SST2, "seed": 9})
    run_job(db, failed, [{"accuracy": 0.99}], status=JobStatus.failed)
    other_task = submit(client, {"model_name_or_path": "tiny-bert", "task_name": "mrpc"})
    run_job(db, other_task, [{"accuracy": 0.7, "f1": 0.81}], metric="f1")

    board = client.get("/v1/leaderboard", params={"task": "SST-2"}).json()
    everything = client.get("/v1/leaderboard").json()

    [sst2] = board["data"]
    assert (sst2["task"], sst2["metric"], board["near_chance_margin"]) == ("sst2", "accuracy", 0.01)
    entries = sst2["entries"]
    assert [(e["rank"], e["kind"], e["id"]) for e in entries] == [
        (1, "job", strong),
        (2, "sweep", sweep["id"]),
        (3, "job", chance),
    ]
    assert [e["value"] for e in entries] == pytest.approx(
        [baseline + 0.15, baseline + 0.10, baseline + 0.005]
    )
    assert [e["near_chance"] for e in entries] == [False, False, True]
    assert entries[0]["final_value"] == pytest.approx(baseline + 0.10)
    swept = entries[1]
    assert swept["configuration"] == {"learning_rate": 1e-4} and swept["seeds"] == 2
    assert swept["std"] == pytest.approx(statistics.stdev([baseline + 0.08, baseline + 0.12]))
    assert swept["job_ids"] == sweep["job_ids"][:2]
    assert (
        entries[0]["hyperparameters"]["learning_rate"] == 3e-4 and entries[0]["hyperparameters"]["seed"] == 1
    )
    assert (entries[0]["model"], entries[0]["recipe"], entries[0]["trainable_params"]) == (
        "tiny-bert",
        "no_trainer",
        1000 + strong,
    )
    assert entries[0]["baseline"] == {
        "metric": "accuracy",
        "value": pytest.approx(baseline),
        "majority_label": entries[0]["baseline"]["majority_label"],
        "share": pytest.approx(baseline),
        "rows": 40,
        "where": "GLUE file SST-2/dev.tsv",
    }
    assert sst2["baseline"]["rows"] == 872 and sst2["baseline"]["value"] == pytest.approx(
        sst2_baseline(glue_data, None)
    )
    assert [b["task"] for b in everything["data"]] == ["sst2", "mrpc"]
    assert [e["id"] for e in everything["data"][1]["entries"]] == [other_task]
    assert client.get("/v1/leaderboard", params={"task": "glue"}).status_code == 422


def test_the_leaderboard_shows_a_key_its_own_results(settings: Settings, db: Database) -> None:
    keyed = settings.model_copy(update={"api_keys": ["alice-key", "bob-key"]})
    client = TestClient(create_app(keyed, db), base_url=LOOPBACK_URL)
    created = client.post("/v1/jobs", json={"spec": SST2}, headers={"Authorization": "Bearer alice-key"})
    run_job(db, created.json()["id"], [{"accuracy": 0.9}])

    alice = client.get("/v1/leaderboard", headers={"Authorization": "Bearer alice-key"}).json()["data"]
    bob = client.get("/v1/leaderboard", headers={"Authorization": "Bearer bob-key"}).json()["data"]

    assert [e["id"] for e in alice[0]["entries"]] == [created.json()["id"]]
    assert bob == []


# ---------------------------------------------------------------------------------------------------
# Reruns
# ---------------------------------------------------------------------------------------------------


def test_a_rerun_says_whether_it_reproduced_the_original(client: TestClient, db: Database) -> None:
    original = submit(client, {**SST2, "seed": 5})
    evals = [{"accuracy": 0.75, "loss": 0.5}, {"accuracy": 0.70, "loss": 0.45}]
    run_job(db, original, evals, environment={"packages": {"torch": "2.13.0"}, "python": "3.11.9"})

    reruns = [client.post(f"/v1/jobs/{original}/rerun") for _ in range(4)]
    assert all(r.status_code == 201 for r in reruns)
    exact, close, off, broken = (r.json()["id"] for r in reruns)
    pending = client.get(f"/v1/jobs/{exact}").json()
    run_job(db, exact, evals)
    run_job(db, close, [{"accuracy": 0.75, "loss": 0.5 + 4e-7}, {"accuracy": 0.70, "loss": 0.45}])
    run_job(
        db,
        off,
        [{"accuracy": 0.75, "loss": 0.5}, {"accuracy": 0.72, "loss": 0.45}],
        environment={"packages": {"torch": "2.12.0"}, "python": "3.11.9"},
    )
    run_job(db, broken, [{"accuracy": 0.75, "loss": 0.5}], status=JobStatus.failed)

    assert (
        pending["rerun_of"] == original
        and pending["spec"] == client.get(f"/v1/jobs/{original}").json()["spec"]
    )
    assert pending["metadata"] == {"rerun_of": str(original)}
    assert pending["reproduction"]["status"] == "pending"
    matched = client.get(f"/v1/jobs/{exact}").json()["reproduction"]
    assert (matched["status"], matched["match"], matched["max_abs_difference"]) == ("matched", "exact", 0.0)
    assert matched["compared"] == 6  # final accuracy, loss, step; best accuracy, loss, step
    within = client.get(f"/v1/jobs/{close}").json()["reproduction"]
    assert (within["status"], within["match"]) == ("matched", "within_tolerance")
    assert within["tolerance"] == {"absolute": 1e-6} and within["max_abs_difference"] == pytest.approx(4e-7)
    differs = client.get(f"/v1/jobs/{off}").json()["reproduction"]
    assert (differs["status"], differs["match"]) == ("differs", None)
    assert differs["differences"] == [
        {
            "evaluation": "final",
            "split": "eval",
            "name": "accuracy",
            "original": 0.70,
            "rerun": 0.72,
            "difference": pytest.approx(0.02),
        }
    ]
    assert differs["environment_differences"] == ["torch: 2.13.0 → 2.12.0"]
    failed = client.get(f"/v1/jobs/{broken}").json()["reproduction"]
    assert failed["status"] == "not_comparable" and "the rerun failed" in failed["reason"]
    assert client.post("/v1/jobs/999/rerun").status_code == 404
