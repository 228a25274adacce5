"""Nothing a user gives is dropped or changed without a word (issue 17, found 1): Trainer's options are
honoured, fractional epochs run as in Trainer, a label that looks like a typo is a warning (a 422 with
a task), warnings are kept on the job, and a sweep's stored spec keeps its types."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gluejobs.cli.script_args import config_file_to_spec, resolved_spec
from service.main import create_app
from shared.core.config import Settings
from shared.core.db import Database
from shared.jobspec.schedule import plan_schedule
from tests.support.e2e import LOOPBACK_URL
from tests.support.runs import make_spec, train
from worker.training.progress import Progress

SQLITE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
SST2 = {"model_name_or_path": "tiny-bert", "task_name": "sst2"}


@pytest.fixture
def client(settings: Settings, db: Database) -> TestClient:
    return TestClient(create_app(settings, db), base_url=LOOPBACK_URL)


def created(client: TestClient, spec: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
    response = client.post("/v1/jobs", params={"dry_run": "true"} if dry_run else {}, json={"spec": spec})
    assert response.status_code == (200 if dry_run else 201), response.text
    body: dict[str, Any] = response.json()
    return body


# --- Trainer's options --------------------------------------------------------------------------------


def test_a_trainer_configs_greater_is_better_and_fractional_epochs_are_kept(tmp_path: Path) -> None:
    config = tmp_path / "training_args.json"
    config.write_text(
        json.dumps(
            {
                "model_name_or_path": "m",
                "task_name": "mrpc",
                "num_train_epochs": 2.5,
                "eval_strategy": "epoch",
                "save_strategy": "epoch",
                "load_best_model_at_end": True,
                "metric_for_best_model": "eval_loss",
                "greater_is_better": False,
            }
        )
    )

    spec = resolved_spec(config_file_to_spec(config).spec)

    assert (spec["num_train_epochs"], spec["greater_is_better"]) == (2.5, False)
    assert spec["metric_for_best_model"] == "eval_loss"


def test_greater_is_better_ranks_the_evaluations_as_given() -> None:
    as_given = Progress(steps_per_epoch=1, ranking="accuracy", greater=False)
    own_way = Progress(steps_per_epoch=1, ranking="accuracy")
    for progress in (as_given, own_way):
        for step, value in ((1, 0.7), (2, 0.9), (3, 0.6)):
            progress.completed_steps = step
            progress.record_evaluation({"accuracy": value}, threshold=0.0)

    assert (as_given.best_step, as_given.best_value) == (3, 0.6)
    assert (own_way.best_step, own_way.best_value) == (2, 0.9)


@SQLITE
def test_greater_is_better_against_its_metric_is_honoured_with_a_warning(client: TestClient) -> None:
    job = created(client, {**SST2, "metric_for_best_model": "accuracy", "greater_is_better": False})
    agreeing = created(client, {**SST2, "metric_for_best_model": "loss", "greater_is_better": False})

    assert job["spec"]["greater_is_better"] is False
    assert any(w.startswith("greater_is_better: False ranks accuracy") for w in job["warnings"])
    assert not any("greater_is_better" in w for w in agreeing["warnings"])
    alone = client.post("/v1/jobs", json={"spec": {**SST2, "greater_is_better": True}})
    assert alone.status_code == 422 and alone.json()["error"]["field"] == "spec.greater_is_better"


# --- fractional epochs ----------------------------------------------------------------------------------


def test_fractional_epochs_count_steps_as_trainer_does() -> None:
    half = plan_schedule(
        10, accumulation=1, max_train_steps=None, num_train_epochs=2.5, num_warmup_steps=0, warmup_ratio=0.1
    )
    whole = plan_schedule(
        10, accumulation=2, max_train_steps=None, num_train_epochs=3, num_warmup_steps=0, warmup_ratio=0.0
    )

    assert (half.max_train_steps, half.num_epochs, half.warmup_steps) == (25, 3, 3)
    assert (whole.max_train_steps, whole.num_epochs) == (15, 3)


def test_the_loop_trains_a_fraction_of_an_epoch_and_evaluates_where_it_stops(
    train_settings: Settings, tmp_path: Path
) -> None:
    # 32 rows in batches of 8: 4 steps an epoch, so 1.5 epochs are 6 steps.
    spec = make_spec(num_train_epochs=1.5, max_train_samples=32, eval_strategy="epoch")

    run, result, _ = train(spec, train_settings, tmp_path)

    assert [step for step, _ in run.values("train", "loss")] == [1, 2, 3, 4, 5, 6]
    assert run.steps("eval") == [4, 6]
    assert result["completed_steps"] == 6


@SQLITE
def test_the_dry_run_plans_a_fraction_of_an_epoch(client: TestClient) -> None:
    plan = created(
        client,
        {**SST2, "num_train_epochs": 1.5, "max_train_samples": 40, "per_device_train_batch_size": 8},
        dry_run=True,
    )

    schedule = plan["schedule"]
    assert (schedule["steps_per_epoch"], schedule["total_optimizer_steps"]) == (5, 8)
    assert schedule["evaluation_steps"] == [5, 8]
    assert plan["spec"]["num_train_epochs"] == 1.5


# --- labels that look like typos ------------------------------------------------------------------------


def write_rows(path: Path, labels: list[str]) -> None:
    path.write_text(
        "sentence,label\n" + "".join(f"sentence number {i},{label}\n" for i, label in enumerate(labels))
    )


@SQLITE
@pytest.mark.parametrize(
    ("rare", "frequent"),
    [pytest.param("postive", "positive", id="issue-typo"), pytest.param("Negative", "negative", id="case")],
)
def test_a_rare_label_beside_a_near_identical_one_is_refused_unless_kept(
    client: TestClient, settings: Settings, rare: str, frequent: str
) -> None:
    """A stray label is a problem named with its row and near match, on submit and in the dry run,
    before any training (issue 35); `keep_labels` says it is a class of its own, with a warning."""
    write_rows(settings.data_dir / "train.csv", ["positive", "negative"] * 15 + [rare])
    write_rows(settings.data_dir / "dev.csv", ["positive", "negative"] * 3)
    spec = {"model_name_or_path": "tiny-bert", "train_file": "train.csv", "validation_file": "dev.csv"}

    for params in ({}, {"dry_run": "true"}):
        refused = client.post("/v1/jobs", params=params, json={"spec": spec})
        assert refused.status_code == 422, refused.text
        message = " ".join(e["message"] for e in refused.json()["error"]["errors"])
        assert f"label {rare!r} on row 31" in message and repr(frequent) in message, message
        assert "keep_labels" in message, message

    kept = {**spec, "keep_labels": [rare]}
    job = created(client, kept)
    plan = created(client, kept, dry_run=True)

    assert [w for w in job["warnings"] if rare in w], job["warnings"]
    assert sorted(plan["data"]["label_names"]) == sorted(["positive", "negative", rare])
    assert client.get(f"/v1/jobs/{job['id']}").json()["warnings"] == job["warnings"]


@SQLITE
def test_labels_that_differ_widely_are_no_typo(client: TestClient, settings: Settings) -> None:
    write_rows(settings.data_dir / "train.csv", ["good"] * 20 + ["bad"] * 20 + ["neutral"])
    write_rows(settings.data_dir / "dev.csv", ["good", "bad"])

    job = created(
        client, {"model_name_or_path": "tiny-bert", "train_file": "train.csv", "validation_file": "dev.csv"}
    )

    assert not [w for w in job["warnings"] if "typo" in w]


@SQLITE
def test_with_a_task_such_a_label_is_refused_with_its_near_match(
    client: TestClient, settings: Settings
) -> None:
    write_rows(settings.data_dir / "train.csv", ["positive", "negative"] * 5 + ["postive"])

    response = client.post("/v1/jobs", json={"spec": {**SST2, "train_file": "train.csv"}})

    assert response.status_code == 422
    error = response.json()["error"]
    assert error["field"] == "spec.train_file"
    assert "label 'postive' on row 11 does not fit the task" in error["message"]
    assert error["message"].endswith("did you mean 'positive'?")


# --- warnings on the job, and types in stored specs -----------------------------------------------------


def test_warnings_are_stored_with_the_job(client: TestClient) -> None:
    job = created(client, {**SST2, "max_train_steps": 4, "num_train_epochs": 5})

    stored = client.get(f"/v1/jobs/{job['id']}").json()
    assert stored["warnings"] == job["warnings"]
    assert (
        "num_train_epochs: max_train_steps 4 overrides num_train_epochs 5, as in the scripts"
        in stored["warnings"]
    )


@SQLITE
def test_a_sweep_stores_its_values_with_their_types(client: TestClient) -> None:
    body = {
        "spec": {**SST2, "num_train_epochs": "2", "max_seq_length": "64", "max_train_samples": 16},
        "seeds": [1],
        "grid": {"learning_rate": ["1e-4", "5e-4"], "lr_scheduler_type": ["cosine", "linear"]},
    }

    plan = client.post("/v1/sweeps", params={"dry_run": "true"}, json=body)
    response = client.post("/v1/sweeps", json=body)

    assert plan.status_code == 200 and len(plan.json()["jobs"]) == 4
    assert response.status_code == 201, response.text
    sweep = client.get(f"/v1/sweeps/{response.json()['id']}").json()
    assert sweep["grid"] == {"learning_rate": [1e-4, 5e-4], "lr_scheduler_type": ["cosine", "linear"]}
    assert (sweep["spec"]["num_train_epochs"], sweep["spec"]["max_length"]) == (2, 64)
    assert plan.json()["grid"] == sweep["grid"]
    assert (
        client.get("/v1/jobs", params={"limit": 100}).json()["data"].__len__() == 4
    )  # the dry run stored none
