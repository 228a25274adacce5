"""Specs that cannot run are refused with a 4xx that names the field, and nothing is stored."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.main import create_app
from shared.core.config import Settings
from shared.core.db import Database
from shared.core.tables import Job
from tests.support.dbutil import assert_refused, count_rows
from tests.support.e2e import LOOPBACK_URL

GOOD = {"model_name_or_path": "tiny-bert", "task_name": "sst2"}


def spec(**changes: Any) -> dict[str, Any]:
    result = {**GOOD, **changes}
    return {k: v for k, v in result.items() if v is not None}


BAD_SPECS = [
    pytest.param(spec(task_name="glue-ish"), "spec.task_name", "unknown task", id="unknown-task"),
    pytest.param(
        spec(task_name=None), "spec.task_name", "give a task_name or a train_file", id="no-task-no-files"
    ),
    pytest.param(
        spec(per_device_train_batch_sizes=8),
        "spec.per_device_train_batch_sizes",
        "unknown field; did you mean 'per_device_train_batch_size'?",
        id="unknown-field",
    ),
    pytest.param(
        spec(learning_rate="fast"),
        "spec.learning_rate",
        "must be a number, not 'fast'",
        id="wrong-type-float",
    ),
    pytest.param(
        spec(num_train_epochs="three"), "spec.num_train_epochs", "must be a number", id="wrong-type-number"
    ),
    pytest.param(spec(apply_lora="maybe"), "spec.apply_lora", "must be true or false", id="wrong-type-bool"),
    pytest.param(spec(learning_rate=0), "spec.learning_rate", "greater than 0", id="zero-learning-rate"),
    pytest.param(
        spec(learning_rate=-1e-5), "spec.learning_rate", "greater than 0", id="negative-learning-rate"
    ),
    pytest.param(
        spec(per_device_train_batch_size=0),
        "spec.per_device_train_batch_size",
        "must be at least 1, not 0",
        id="zero-batch",
    ),
    pytest.param(
        spec(per_device_eval_batch_size=-4),
        "spec.per_device_eval_batch_size",
        "must be at least 1",
        id="negative-eval-batch",
    ),
    pytest.param(
        spec(num_train_epochs=0), "spec.num_train_epochs", "must be greater than 0", id="zero-epochs"
    ),
    pytest.param(
        spec(gradient_accumulation_steps=0),
        "spec.gradient_accumulation_steps",
        "must be at least 1",
        id="zero-accumulation",
    ),
    pytest.param(spec(max_train_steps=0), "spec.max_train_steps", "must be at least 1", id="zero-max-steps"),
    pytest.param(
        spec(lr_scheduler_type="exponential"), "spec.lr_scheduler_type", "linear", id="unknown-scheduler"
    ),
    pytest.param(
        spec(num_warmup_steps=10, warmup_ratio=0.1), "spec.warmup_ratio", "not both", id="both-warmups"
    ),
    pytest.param(spec(warmup_ratio=1.5), "spec.warmup_ratio", "less than 1", id="warmup-ratio-above-one"),
    pytest.param(spec(apply_lora=True, lora_r=0), "spec.lora_r", "must be at least 1", id="lora-rank-zero"),
    pytest.param(spec(lora_dropout=1.0), "spec.lora_dropout", "less than 1", id="lora-dropout-one"),
    pytest.param(spec(fp16=True, bf16=True), "spec.bf16", "one mixed precision", id="fp16-and-bf16"),
    pytest.param(
        spec(eval_strategy="steps"), "spec.eval_steps", "needs eval_steps", id="steps-without-steps"
    ),
    pytest.param(
        spec(evaluation_strategy="sometimes"),
        "spec.evaluation_strategy",
        "must be one of no, epoch, steps, not 'sometimes'",
        id="unknown-eval-strategy",
    ),
    pytest.param(
        spec(load_best_model_at_end=True, save_strategy="no"),
        "spec.save_strategy",
        "equal to eval",
        id="best-model-without-saves",
    ),
    pytest.param(
        spec(metric_for_best_model="bleu"),
        "spec.metric_for_best_model",
        "not reported",
        id="unknown-best-metric",
    ),
    pytest.param(spec(trust_remote_code=True), "spec.trust_remote_code", "never trusted", id="remote-code"),
    pytest.param(spec(max_length=0), "spec.max_length", "must be at least 1", id="zero-max-length"),
    pytest.param(
        spec(task_name=None, train_file="train.txt", validation_file="dev.csv"),
        "spec.train_file",
        "not a data file",
        id="unknown-file-format",
    ),
    pytest.param(
        spec(task_name=None, train_file="train.csv"),
        "spec.validation_file",
        "needs a validation_file",
        id="train-file-without-validation",
    ),
    pytest.param(
        spec(task_name=None, train_file="../outside.csv", validation_file="dev.csv"),
        "spec.train_file",
        "leaves the data folder",
        id="file-dotdot",
    ),
    pytest.param(
        spec(validation_file="sub/../../outside.csv"),
        "spec.validation_file",
        "leaves the data folder",
        id="file-nested-dotdot",
    ),
    pytest.param(
        spec(task_name=None, train_file="/etc/passwd.csv", validation_file="dev.csv"),
        "spec.train_file",
        "absolute and outside",
        id="file-absolute",
    ),
    pytest.param(
        spec(task_name=None, train_file="escape/train.csv", validation_file="dev.csv"),
        "spec.train_file",
        "leaves the data folder",
        id="file-symlink-out",
    ),
    pytest.param(
        spec(test_file="../../x.jsonl"), "spec.test_file", "leaves the data folder", id="test-file-dotdot"
    ),
    pytest.param(
        spec(model_name_or_path="../elsewhere/model"),
        "spec.model_name_or_path",
        "'..' component",
        id="model-dotdot",
    ),
    pytest.param(
        spec(model_name_or_path="/opt/models/bert"),
        "spec.model_name_or_path",
        "absolute and outside",
        id="model-absolute",
    ),
    pytest.param(
        spec(model_name_or_path="escape"),
        "spec.model_name_or_path",
        "leaves the models folder",
        id="model-symlink-out",
    ),
    pytest.param(
        spec(model_name_or_path=""), "spec.model_name_or_path", "must not be empty", id="model-empty"
    ),
]


@pytest.fixture
def client(settings: Settings, tmp_path: Path, db: Database) -> TestClient:
    outside = tmp_path / "outside"
    outside.mkdir()
    # Links inside the roots that point out of them.
    os.symlink(outside, settings.data_dir / "escape")
    models = tmp_path / "models"
    models.mkdir()
    os.symlink(outside, models / "escape")
    return TestClient(
        create_app(settings.model_copy(update={"models_dir": models}), db), base_url=LOOPBACK_URL
    )


@pytest.mark.parametrize(("body_spec", "field", "message"), BAD_SPECS)
def test_bad_spec_is_refused_and_not_stored(
    client: TestClient, db: Database, body_spec: dict[str, Any], field: str, message: str
) -> None:
    assert_refused(client, db, body_spec, field, message)


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        pytest.param({"spec": GOOD, "priority": "high"}, 422, "priority", id="priority-type"),
        pytest.param({"spec": GOOD, "max_attempts": 0}, 422, "max_attempts", id="attempts-zero"),
        pytest.param({"spec": GOOD, "metadata": {"k": 1}}, 422, "metadata.k", id="metadata-value-type"),
        pytest.param({"spec": GOOD, "colour": "red"}, 422, "colour", id="unknown-top-level-field"),
        pytest.param({"priority": 1}, 422, "spec", id="no-spec"),
        pytest.param([GOOD], 422, None, id="not-an-object"),
    ],
)
def test_bad_request_body_is_refused_and_not_stored(
    client: TestClient, db: Database, body: Any, status: int, field: str | None
) -> None:
    response = client.post("/v1/jobs", json=body)

    assert response.status_code == status, response.text
    assert response.json()["error"].get("field") == field
    assert count_rows(db, Job) == 0


def test_malformed_json_is_a_400_and_not_stored(client: TestClient, db: Database) -> None:
    response = client.post("/v1/jobs", content=b'{"spec": {', headers={"content-type": "application/json"})

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"
    assert count_rows(db, Job) == 0


def test_oversized_body_is_a_413_and_not_stored(client: TestClient, db: Database) -> None:
    body = {"spec": GOOD, "metadata": {"blob": "x" * 500}} | {"pad": "y" * 2_000_000}

    response = client.post("/v1/jobs", json=body)

    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert count_rows(db, Job) == 0
