"""The recipe fields through the API: Trainer's defaults resolved and stored, their names and aliases,
and the combinations that are refused with 422 (nothing stored)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.main import create_app
from shared.core.config import Settings
from shared.core.db import Database
from shared.jobspec.spec import JobSpec
from tests.support.dbutil import assert_refused
from tests.support.e2e import LOOPBACK_URL

GOOD = {"model_name_or_path": "tiny-bert", "task_name": "mrpc"}


@pytest.fixture
def client(settings_factory, db: Database) -> TestClient:  # type: ignore[no-untyped-def]
    settings: Settings = settings_factory(db.url, trackers=["tensorboard", "mlflow"])
    return TestClient(create_app(settings, db), base_url=LOOPBACK_URL)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_trainer_recipe_stores_trainers_defaults(client: TestClient) -> None:
    response = client.post("/v1/jobs", json={"spec": {**GOOD, "recipe": "trainer", "warmup_steps": 100}})

    assert response.status_code == 201, response.text
    spec = response.json()["spec"]
    assert {k: spec[k] for k in ("max_grad_norm", "adam_beta1", "adam_beta2", "adam_epsilon", "optim")} == {
        "max_grad_norm": 1.0,
        "adam_beta1": 0.9,
        "adam_beta2": 0.999,
        "adam_epsilon": 1e-8,
        "optim": "adamw_torch_fused",
    }
    assert (spec["seed"], spec["logging_steps"], spec["eval_strategy"], spec["do_eval"]) == (
        42,
        500,
        "no",
        False,
    )
    assert (spec["save_strategy"], spec["save_steps"], spec["num_warmup_steps"]) == ("steps", 500, 100)
    assert "warmup_steps" not in spec
    # The stored spec is what a worker validates again: it must come back unchanged.
    assert JobSpec.model_validate(spec).model_dump(mode="json") == spec


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_script_recipe_keeps_the_scripts_defaults_and_what_the_spec_says(client: TestClient) -> None:
    plain = client.post("/v1/jobs", json={"spec": GOOD}).json()["spec"]
    trainer = client.post(
        "/v1/jobs",
        json={"spec": {**GOOD, "recipe": "trainer", "max_grad_norm": 0.5, "evaluation_strategy": "epoch"}},
    ).json()["spec"]

    assert (plain["recipe"], plain["max_grad_norm"], plain["eval_strategy"], plain["logging_steps"]) == (
        "no_trainer",
        None,
        "epoch",
        10,
    )
    assert (trainer["max_grad_norm"], trainer["eval_strategy"], trainer["do_eval"]) == (0.5, "epoch", True)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_trackers_the_workers_serve_are_resolved_and_stored(client: TestClient) -> None:
    everything = client.post("/v1/jobs", json={"spec": {**GOOD, "with_tracking": True}}).json()["spec"]
    named = client.post("/v1/jobs", json={"spec": {**GOOD, "report_to": "MLflow"}}).json()["spec"]
    none = client.post("/v1/jobs", json={"spec": {**GOOD, "report_to": "none"}}).json()["spec"]

    assert (everything["report_to"], everything["with_tracking"]) == (["tensorboard", "mlflow"], True)
    assert (named["report_to"], named["with_tracking"]) == (["mlflow"], True)
    assert (none["report_to"], none["with_tracking"]) == ([], False)


def spec(**changes: Any) -> dict[str, Any]:
    return {**GOOD, **changes}


@pytest.mark.parametrize(
    ("body_spec", "field", "message"),
    [
        pytest.param(spec(report_to="wandb"), "spec.report_to", "not served by this cluster", id="unserved"),
        pytest.param(
            spec(report_to=["neptune"]), "spec.report_to", "unknown tracker 'neptune'", id="unknown"
        ),
        pytest.param(spec(lora_r=16), "spec.lora_r", "no effect without apply_lora", id="lora-r"),
        pytest.param(
            spec(lora_target_modules=["query"]),
            "spec.lora_target_modules",
            "without apply_lora",
            id="lora-mods",
        ),
        pytest.param(spec(recipe="keras"), "spec.recipe", "one of no_trainer, trainer", id="recipe"),
        pytest.param(
            spec(optim="adafactor"), "spec.optim", "one of adamw_torch, adamw_torch_fused", id="optim"
        ),
        pytest.param(spec(max_grad_norm=-1), "spec.max_grad_norm", "must be at least 0", id="clip"),
        pytest.param(spec(adam_beta2=1.0), "spec.adam_beta2", "less than 1", id="beta2"),
        pytest.param(
            spec(warmup_steps=10, num_warmup_steps=20), "spec.warmup_steps", "not both", id="warmup-both"
        ),
        pytest.param(spec(warmup_steps=-1), "spec.warmup_steps", "must be at least 0", id="warmup-neg"),
        pytest.param(
            spec(early_stopping_patience=2, eval_strategy="no"),
            "spec.early_stopping_patience",
            "needs eval_strategy",
            id="early-stop-no-evals",
        ),
        pytest.param(spec(do_eval=False), "spec.do_eval", "contradicts eval_strategy 'epoch'", id="do-eval"),
        pytest.param(
            spec(task_name=None, train_file="a.csv", validation_file="b.csv", metric_for_best_model="bleu"),
            "spec.metric_for_best_model",
            "(it reports accuracy, f1, combined_score, pearson, spearmanr, mse, loss)",
            id="own-files-metric",
        ),
    ],
)
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_recipe_options_that_cannot_run_are_refused(
    client: TestClient, db: Database, body_spec: dict[str, Any], field: str, message: str
) -> None:
    assert_refused(client, db, body_spec, field, message)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_own_files_accept_f1_and_mse_as_the_ranking_metric(client: TestClient, settings: Settings) -> None:
    # Submission reads the files: two classes report f1, scores report mse.
    for name, labels in (("classes", ("0", "1")), ("scores", ("0.5", "4.25"))):
        folder = settings.data_dir / name
        folder.mkdir(parents=True, exist_ok=True)
        rows = "".join(f"sentence number {i},{labels[i % 2]}\n" for i in range(6))
        for split in ("train", "dev"):
            (folder / f"{split}.csv").write_text("sentence,label\n" + rows)
    for folder, metric in (("classes", "f1"), ("classes", "eval_f1"), ("scores", "mse")):
        body = spec(
            task_name=None,
            train_file=f"{folder}/train.csv",
            validation_file=f"{folder}/dev.csv",
            metric_for_best_model=metric,
        )
        response = client.post("/v1/jobs", json={"spec": body})
        assert response.status_code == 201, (metric, response.text)


def test_trainers_step_defaults_follow_trainer() -> None:
    # eval_strategy "steps" without eval_steps: Trainer evaluates every logging_steps.
    steps = JobSpec.model_validate(
        {**GOOD, "recipe": "trainer", "eval_strategy": "steps", "logging_steps": 20}
    )
    # The script's checkpointing_steps sets the save strategy and steps itself.
    epochs = JobSpec.model_validate({**GOOD, "recipe": "trainer", "checkpointing_steps": "epoch"})

    assert (steps.eval_steps, steps.save_strategy, steps.save_steps) == (20, "steps", 500)
    assert (epochs.save_strategy, epochs.save_steps) == ("epoch", None)
