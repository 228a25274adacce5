"""The dry run and the data checks a submission runs: POST /v1/jobs?dry_run=true on both databases,
and the plan's figures against the real training loop, the real tokenizer and the real model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.dry_run.plan import plan_job
from service.main import create_app
from shared.core.config import Settings
from shared.core.db import Database
from shared.core.tables import Job
from shared.jobspec.data_scope import DataScope, data_scope
from shared.jobspec.spec import JobSpec
from tests.support.dbutil import count_rows
from tests.support.e2e import LOOPBACK_URL
from tests.support.runs import RecordingReporter, make_spec


def one_user_scope(settings: Settings) -> DataScope:
    """No API keys: the one user's data scope, the whole data folder."""
    return data_scope(settings, owner=None, is_admin=True)


MRPC = {"model_name_or_path": "tiny-bert", "task_name": "mrpc", "max_train_samples": 100, "seed": 1}


@pytest.fixture
def client(settings: Settings, db: Database) -> TestClient:
    return TestClient(create_app(settings, db), base_url=LOOPBACK_URL)


def dry_run(client: TestClient, spec: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/jobs", params={"dry_run": "true"}, json={"spec": spec})
    assert response.status_code == 200, response.text
    plan: dict[str, Any] = response.json()
    return plan


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        # 100 rows / batch 8 = 13 batches; accumulation 3 → ceil(13/3) = 5 steps an epoch; 3 epochs.
        (
            {"gradient_accumulation_steps": 3, "warmup_ratio": 0.1},
            {"steps_per_epoch": 5, "epochs": 3, "total_optimizer_steps": 15, "warmup_steps": 2,
             "evaluation_steps": [5, 10, 15], "checkpoints": 3, "samples_per_optimizer_step": 24},
        ),
        # max_train_steps overrides the epochs: 7 steps are 2 epochs, the second cut short.
        (
            {"gradient_accumulation_steps": 3, "max_train_steps": 7, "warmup_ratio": 0.1},
            {"steps_per_epoch": 5, "epochs": 2, "total_optimizer_steps": 7, "warmup_steps": 1,
             "evaluation_steps": [5, 7], "checkpoints": 2, "samples_per_optimizer_step": 24},
        ),
        # Two processes share the 13 batches (7 each); accumulation 2 → 4 steps an epoch.
        (
            {"num_processes": 2, "gradient_accumulation_steps": 2, "warmup_ratio": 0.25,
             "eval_strategy": "steps", "eval_steps": 5, "save_strategy": "steps", "save_steps": 4},
            {"steps_per_epoch": 4, "epochs": 3, "total_optimizer_steps": 12, "warmup_steps": 3,
             "evaluation_steps": [5, 10, 12], "checkpoints": 3, "samples_per_optimizer_step": 32},
        ),
        (
            {"num_warmup_steps": 4, "max_train_steps": 30, "eval_strategy": "no", "save_strategy": "no"},
            {"steps_per_epoch": 13, "epochs": 3, "total_optimizer_steps": 30, "warmup_steps": 4,
             "evaluation_steps": [], "checkpoints": 0, "samples_per_optimizer_step": 8},
        ),
    ],
)  # fmt: skip
def test_the_plans_step_arithmetic(
    client: TestClient, db: Database, changes: dict[str, Any], expected: dict[str, Any]
) -> None:
    plan = dry_run(client, {**MRPC, **changes})

    schedule = plan["schedule"]
    assert {key: schedule[key] for key in expected} == expected
    assert schedule["evaluations"] == len(expected["evaluation_steps"])
    assert count_rows(db, Job) == 0  # a dry run stores nothing


def test_the_plan_reports_the_data_tokens_and_memory(client: TestClient, db: Database) -> None:
    plan = dry_run(client, {**MRPC, "max_eval_samples": 50, "group_by_length": True})

    train, evaluation = plan["data"]["splits"]["train"], plan["data"]["splits"]["eval"]
    assert (train["where"], train["rows"], train["rows_used"]) == ("GLUE file MRPC/train.tsv", 3668, 100)
    assert sum(train["label_counts"].values()) == 100 and set(train["label_counts"]) == {
        "not_equivalent",
        "equivalent",
    }
    assert (evaluation["rows"], evaluation["rows_used"]) == (408, 50)
    tokens = plan["tokens"]
    assert tokens["status"] == "measured" and tokens["train"]["sample"] == "all rows"
    padding = tokens["train"]["padding"]
    assert padding["used"] == "group_by_length"
    # Sorting by length can only save padding; padding everything to max_length costs the most.
    assert (
        padding["group_by_length"]["tokens"]
        <= padding["dynamic"]["tokens"]
        < padding["pad_to_max_length"]["tokens"]
    )
    assert padding["pad_to_max_length"]["tokens"] == 100 * 128
    memory = plan["memory"]
    assert memory["status"] == "estimated" and memory["basis"] == "safetensors headers"
    assert memory["bytes"]["total"] == sum(v for k, v in memory["bytes"].items() if k != "total")
    assert plan["spec"]["seed"] == 1 and plan["warnings"] == []
    assert count_rows(db, Job) == 0


def test_what_the_api_cannot_read_is_said_unknown(settings: Settings, db: Database, tmp_path: Path) -> None:
    models = tmp_path / "models"
    broken = models / "broken"
    broken.mkdir(parents=True)
    (broken / "tokenizer.json").write_text("{not json")
    # No sizes at all: a size that is not a whole number ("wide") is refused outright since the model
    # size check (test_model_upload_bounds.py), so nothing here gives the memory estimate a shape.
    (broken / "config.json").write_text('{"architectures": ["Unknown"]}')
    no_glue_copy = TestClient(
        create_app(settings.model_copy(update={"models_dir": models, "glue_dir": None}), db),
        base_url=LOOPBACK_URL,
    )
    with_glue_copy = TestClient(
        create_app(settings.model_copy(update={"models_dir": models}), db), base_url=LOOPBACK_URL
    )

    from_hub = dry_run(no_glue_copy, {**MRPC, "model_name_or_path": "bert-base-uncased"})
    local = dry_run(with_glue_copy, {**MRPC, "model_name_or_path": "broken"})

    assert from_hub["data"]["unread"] == [
        "train: the Hub's nyu-mll/glue mrpc 'train' split",
        "eval: the Hub's nyu-mll/glue mrpc 'validation' split",
    ]
    assert from_hub["schedule"]["status"] == "unknown"
    assert from_hub["tokens"] == {
        "status": "unknown",
        "reason": "'bert-base-uncased' is a Hub id: the API does not fetch it",
    }
    assert from_hub["memory"]["status"] == "unknown"
    assert (
        local["tokens"]["status"] == "unknown"
        and "tokenizer.json could not be read" in local["tokens"]["reason"]
    )
    assert local["memory"]["status"] == "unknown"
    assert count_rows(db, Job) == 0


@pytest.fixture
def files(settings: Settings) -> Path:
    data = settings.data_dir
    (data / "good.csv").write_text("sentence,label\na fine film,1\na dull film,0\n")
    (data / "no_sentence.csv").write_text("text,label\na fine film,1\na dull film,0\n")
    (data / "odd_label.tsv").write_text("sentence\tlabel\na fine film\t1\na dull film\tmaybe\n")
    return data


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        (
            {"train_file": "no_sentence.csv", "validation_file": "good.csv"},
            "spec.train_file",
            "train_file 'no_sentence.csv' has no 'sentence' column (its columns: text, label); map yours "
            'with --text_column text (spec: "text_column": "text")',  # the task's text column from "text"
        ),
        (
            {"train_file": "good.csv", "validation_file": "odd_label.tsv"},
            "spec.validation_file",
            "label 'maybe' on row 2 does not fit the task (expected 0..1 or one of negative, positive)",
        ),
        ({"train_file": "nowhere.csv"}, "spec.train_file", "train_file 'nowhere.csv' not found"),
        ({"do_predict": True}, "spec.do_predict", "GLUE file SST-2/test.tsv not found"),
    ],
)
def test_data_that_would_fail_on_a_worker_is_refused_at_submission(
    client: TestClient, db: Database, files: Path, changes: dict[str, Any], field: str, message: str
) -> None:
    spec = {"model_name_or_path": "tiny-bert", "task_name": "sst2", **changes}

    for params in ({}, {"dry_run": "true"}):
        response = client.post("/v1/jobs", params=params, json={"spec": spec})

        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["field"] == field and message in error["message"]
    assert count_rows(db, Job) == 0


def test_the_checks_read_a_changed_file_again(client: TestClient, files: Path) -> None:
    spec = {
        "model_name_or_path": "tiny-bert",
        "task_name": "sst2",
        "train_file": "good.csv",
        "validation_file": "good.csv",
    }
    assert client.post("/v1/jobs", json={"spec": spec}).status_code == 201

    (files / "good.csv").write_text("sentence,label\na fine film,1\na dull film,2\n")  # now a bad label

    response = client.post("/v1/jobs", json={"spec": spec})
    assert response.status_code == 422 and "label 2 on row 2" in response.json()["error"]["message"]


def test_an_api_that_cannot_see_the_data_can_skip_the_checks(settings: Settings, db: Database) -> None:
    client = TestClient(
        create_app(settings.model_copy(update={"check_data_on_submit": False}), db), base_url=LOOPBACK_URL
    )

    response = client.post("/v1/jobs", json={"spec": {**MRPC, "train_file": "nowhere.csv"}})

    assert response.status_code == 201  # the worker will fail it, naming the file


# ---------------------------------------------------------------------------------------------------
# The plan against the real loop, tokenizer and model (no database)
# ---------------------------------------------------------------------------------------------------


def test_the_schedule_is_what_the_training_loop_does(train_settings: Settings, tmp_path: Path) -> None:
    from worker.training.loop import run_training

    spec = make_spec(  # SST-2 rows, batches of 8, no checkpoints
        max_train_samples=40,
        max_eval_samples=16,
        gradient_accumulation_steps=3,
        max_train_steps=3,
        warmup_ratio=0.5,
        eval_strategy="epoch",
        seed=2,
    )
    plan = plan_job(spec, train_settings, scope=one_user_scope(train_settings))["schedule"]

    recorder = RecordingReporter()
    result = run_training(spec, train_settings, output_dir=tmp_path / "out", reporter=recorder)

    # 40 rows / 8 = 5 batches; accumulation 3 → 2 steps an epoch; 3 steps → 2 epochs; warmup ⌈1.5⌉ = 2.
    training = next(d for d in recorder.log_data if "max_train_steps" in d)
    assert (plan["steps_per_epoch"], plan["epochs"], plan["total_optimizer_steps"], plan["warmup_steps"]) == (
        2,
        2,
        3,
        2,
    )
    assert (training["num_epochs"], training["max_train_steps"], training["warmup_steps"]) == (2, 3, 2)
    assert result["completed_steps"] == plan["total_optimizer_steps"]
    assert recorder.steps("eval") == plan["evaluation_steps"] == [2, 3]


def test_token_lengths_are_the_workers_tokenizers(train_settings: Settings, models_dir: Path) -> None:
    from transformers import AutoTokenizer

    from shared.data.reading import read_job_data

    spec = JobSpec(model_name_or_path="tiny-bert", task_name="mrpc", max_train_samples=300, max_length=40)
    tokens = plan_job(spec, train_settings, scope=one_user_scope(train_settings))["tokens"]

    data = read_job_data(spec, train_settings)
    assert data.train is not None
    tokenizer = AutoTokenizer.from_pretrained(models_dir / "tiny-bert")
    untruncated = tokenizer(data.train.texts["sentence1"].tolist(), data.train.texts["sentence2"].tolist())
    truncated = tokenizer(
        data.train.texts["sentence1"].tolist(),
        data.train.texts["sentence2"].tolist(),
        truncation=True,
        max_length=40,
    )
    lengths = [len(ids) for ids in truncated["input_ids"]]
    assert tokens["train"]["longest"] == max(lengths) == 40
    assert tokens["train"]["mean"] == round(sum(lengths) / len(lengths), 2)
    assert tokens["train"]["longest_before_truncation"] == max(len(ids) for ids in untruncated["input_ids"])
    assert tokens["train"]["truncated_rows"] == sum(len(ids) > 40 for ids in untruncated["input_ids"])
    assert tokens["train"]["padding"]["real_tokens"] == sum(lengths)


def test_the_memory_estimate_counts_the_models_parameters(train_settings: Settings, models_dir: Path) -> None:
    from transformers import AutoModelForSequenceClassification

    spec = JobSpec(model_name_or_path="tiny-bert", task_name="mrpc", max_train_samples=64)
    lora = spec.model_copy(update={"apply_lora": True, "lora_r": 4})
    full, adapted = (
        plan_job(spec, train_settings, scope=one_user_scope(train_settings))["memory"],
        plan_job(lora, train_settings, scope=one_user_scope(train_settings))["memory"],
    )

    from peft import LoraConfig, TaskType, get_peft_model

    model = AutoModelForSequenceClassification.from_pretrained(models_dir / "tiny-bert", num_labels=2)
    assert full["parameters"] == sum(p.numel() for p in model.parameters())
    assert full["trainable_parameters"] == full["parameters"]
    peft_model = get_peft_model(
        model, LoraConfig(task_type=TaskType.SEQ_CLS, r=4)
    )  # as worker.training.modeling does
    assert adapted["trainable_parameters"] == sum(
        p.numel() for p in peft_model.parameters() if p.requires_grad
    )
    assert adapted["bytes"]["optimizer"] < full["bytes"]["optimizer"]


def test_the_plans_trainable_count_leaves_out_the_frozen_word_embeddings(
    train_settings: Settings, models_dir: Path
) -> None:
    """freeze_word_embeddings: the plan counts what the worker's own model build (worker/training/loop.py's
    _build_model) leaves trainable, with and without LoRA (issue 35: 22.7M planned, 11.0M trained)."""
    from types import SimpleNamespace

    from worker.training.loop import _build_model

    base = JobSpec(model_name_or_path="tiny-bert", task_name="mrpc", max_train_samples=64)
    for spec in (
        base.model_copy(update={"freeze_word_embeddings": True}),
        base.model_copy(update={"freeze_word_embeddings": False}),
        base.model_copy(update={"freeze_word_embeddings": True, "apply_lora": True, "lora_r": 4}),
    ):
        memory = plan_job(spec, train_settings, scope=one_user_scope(train_settings))["memory"]
        raw = SimpleNamespace(label_names=["not_equivalent", "equivalent"])
        model = _build_model(str(models_dir / "tiny-bert"), spec, raw, 2)  # type: ignore[arg-type]
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        assert memory["trainable_parameters"] == trained, spec
        if not spec.apply_lora:
            assert memory["parameters"] == sum(p.numel() for p in model.parameters())
        if spec.freeze_word_embeddings and not spec.apply_lora:
            table = model.get_input_embeddings().weight.numel()
            assert memory["parameters"] - memory["trainable_parameters"] == table > 0
            assert memory["bytes"]["optimizer"] == 8 * trained
