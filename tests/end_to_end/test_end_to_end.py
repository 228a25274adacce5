"""End to end: specs go in over real HTTP, a real worker process trains them, results come back.

Real GLUE rows from ../shared/glue_data, a tiny BERT built in a fixture, SQLite and Postgres.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shared.core.config import Settings
from tests.support.e2e import (
    REPO,
    all_metrics,
    get,
    live_api,
    run_worker_until_idle,
    start_worker,
    submit,
    wait_for,
)
from tests.support.kit import write_mnli

pytestmark = pytest.mark.e2e

TINY = "tiny-bert"
SMALL = {
    "model_name_or_path": TINY,
    "max_train_samples": 64,
    "max_eval_samples": 48,
    "per_device_train_batch_size": 16,
    "per_device_eval_batch_size": 32,
    "learning_rate": 1e-3,
    "logging_steps": 2,
    "seed": 11,
}


@pytest.fixture
def e2e_settings(settings_factory, tmp_path: Path, glue_data: Path, db_url: str) -> Settings:  # type: ignore[no-untyped-def]
    """A GLUE folder with the kit's tasks plus an MNLI fixture; data files; a model that will not load."""
    glue = tmp_path / "glue"
    glue.mkdir()
    for task in ("CoLA", "SST-2", "MRPC", "STS-B", "QNLI"):
        os.symlink(glue_data / task, glue / task)
    write_mnli(glue / "MNLI")
    settings: Settings = settings_factory(db_url, glue_dir=glue)
    data = settings.data_dir
    (data / "mrpc").mkdir(parents=True)
    for split in ("train", "validation"):
        shutil.copy(glue_data / "hf" / "mrpc" / f"{split}.parquet", data / "mrpc" / f"{split}.parquet")
    # Files that are fine when the job is submitted (the API checks them) and change before a worker
    # runs it (break_files_after_submission): the worker's own checks must fail the job.
    (data / "bad").mkdir()
    (data / "bad" / "train.csv").write_text("sentence,label\nfine film,1\nawful film,0\nok film,0\n")
    (data / "bad" / "dev.csv").write_text("sentence,label\ngood,1\nbad,0\n")
    shutil.copytree(data / "bad", data / "nowhere")
    return settings


def break_files_after_submission(settings: Settings) -> None:
    shutil.rmtree(settings.data_dir / "nowhere")
    (settings.data_dir / "bad" / "train.csv").write_text(
        "sentence,label\nfine film,1\nawful film,7\nok film,0\n"
    )


@pytest.fixture
def broken_model(e2e_settings: Settings) -> str:
    folder = e2e_settings.models_dir / "broken-model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text('{"model_type": "bert", "hidden_size": "not a number"')
    return "broken-model"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_jobs_of_every_kind_run_through_the_api_and_a_worker(
    e2e_settings: Settings, broken_model: str, tmp_path: Path
) -> None:
    with live_api(e2e_settings) as client:
        jobs = {
            "sst2": submit(
                client, {**SMALL, "task_name": "sst2", "num_train_epochs": 2, "save_total_limit": 1}
            ),
            "stsb": submit(client, {**SMALL, "task_name": "stsb"}),
            "mnli": submit(client, {**SMALL, "task_name": "mnli", "num_train_epochs": 2}),
            "lora": submit(
                client,
                {
                    **SMALL,
                    "task_name": "mrpc",
                    "train_file": "mrpc/train.parquet",
                    "validation_file": "mrpc/validation.parquet",
                    "apply_lora": True,
                    "lora_r": 4,
                    "lora_target_modules": ["query", "value"],
                    "save_merged_model": True,
                },
            ),
            "missing_file": submit(
                client,
                {
                    **SMALL,
                    "task_name": None,
                    "train_file": "nowhere/train.csv",
                    "validation_file": "nowhere/dev.csv",
                },
            ),
            "bad_labels": submit(
                client,
                {
                    **SMALL,
                    "task_name": "sst2",
                    "train_file": "bad/train.csv",
                    "validation_file": "bad/dev.csv",
                },
            ),
            "bad_model": submit(client, {**SMALL, "model_name_or_path": broken_model, "task_name": "sst2"}),
            "after_failures": submit(client, {**SMALL, "task_name": "cola", "max_train_samples": 32}),
        }
        break_files_after_submission(e2e_settings)

        run_worker_until_idle(e2e_settings, tmp_path / "worker.log")

        final = {name: get(client, f"/v1/jobs/{job['id']}") for name, job in jobs.items()}
        statuses = {name: job["status"] for name, job in final.items()}
        assert statuses == {
            "sst2": "succeeded",
            "stsb": "succeeded",
            "mnli": "succeeded",
            "lora": "succeeded",
            "missing_file": "failed",
            "bad_labels": "failed",
            "bad_model": "failed",
            "after_failures": "succeeded",
        }, {n: j["error"] for n, j in final.items()}

        # Failures say why, with a code; the job's own input fails at once (attempts 1).
        assert {name: final[name]["error_code"] for name in ("missing_file", "bad_labels", "bad_model")} == {
            "missing_file": "invalid_data",
            "bad_labels": "invalid_data",
            "bad_model": "model_load_failed",
        }
        assert all(final[name]["attempts"] == 1 for name in ("missing_file", "bad_labels", "bad_model"))
        assert "last log lines:" in final["bad_labels"]["error"]
        assert "nowhere/train.csv" in final["missing_file"]["error"]
        assert "7" in final["bad_labels"]["error"]
        assert "broken-model" in final["bad_model"]["error"]

        check_classification_job(client, final["sst2"], epochs=2)
        check_regression_job(client, final["stsb"])
        check_mnli_job(client, final["mnli"])
        check_lora_job(final["lora"])

        # `gluejobs watch` follows a job from the command line.
        watch = subprocess.run(
            [
                sys.executable,
                "-m",
                "gluejobs.cli",
                "watch",
                str(jobs["sst2"]["id"]),
                "--url",
                str(client.base_url),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        assert watch.returncode == 0, watch.stderr
        assert "eval" in watch.stdout and "accuracy" in watch.stdout
        assert f"job {jobs['sst2']['id']} succeeded" in watch.stdout


def check_classification_job(client: Any, job: dict[str, Any], *, epochs: int) -> None:
    rows = all_metrics(client, job["id"])
    train = [r for r in rows if r["split"] == "train"]
    evals = [r for r in rows if r["split"] == "eval"]
    # 64 rows / batch 16 = 4 steps per epoch; a loss and a learning-rate row every 2 steps.
    assert [r["step"] for r in train if r["name"] == "loss"] == [2, 4, 6, 8][: 2 * epochs]
    assert {r["name"] for r in train} == {"loss", "learning_rate"}
    assert [(r["step"], r["epoch"]) for r in evals if r["name"] == "accuracy"] == [(4, 1.0), (8, 2.0)]
    assert all(0.0 <= r["value"] <= 1.0 for r in evals if r["name"] == "accuracy")
    assert job["latest_metrics"]["eval"]["step"] == 8
    assert job["best_metrics"]["metric"] == "accuracy"
    # save_total_limit=1 keeps the newest checkpoint (and the best, when it differs).
    checkpoints = get(client, f"/v1/jobs/{job['id']}/checkpoints")["data"]
    assert checkpoints and checkpoints[-1]["step"] == 8
    assert all(Path(c["path"]).is_dir() for c in checkpoints)
    assert checkpoints[-1]["metrics"]["accuracy"] == job["latest_metrics"]["eval"]["accuracy"]
    output = Path(job["output_dir"])
    assert (output / "model.safetensors").is_file() and (output / "tokenizer.json").is_file()
    result = job["result"]
    assert result["completed_steps"] == 8 and result["train_samples_per_second"] > 0
    assert result["peak_rss_mb"] > 0 and result["trainable_params"] == result["total_params"]
    events = [e["message"] for e in get(client, f"/v1/jobs/{job['id']}/events")["data"]]
    assert events[0] == "job queued" and events[-1] == "job succeeded"
    assert any(m.startswith("claimed by worker") for m in events)
    assert job["started_at"] <= job["finished_at"] and job["attempts"] == 1


def check_regression_job(client: Any, job: dict[str, Any]) -> None:
    names = {r["name"] for r in all_metrics(client, job["id"]) if r["split"] == "eval"}
    assert names == {"pearson", "spearmanr", "combined_score", "loss"}
    assert -1.0 <= job["latest_metrics"]["eval"]["pearson"] <= 1.0


def check_mnli_job(client: Any, job: dict[str, Any]) -> None:
    rows = all_metrics(client, job["id"])
    for split in ("eval", "eval_mismatched"):
        assert [r["step"] for r in rows if r["split"] == split and r["name"] == "accuracy"] == [3, 6]
    assert set(job["latest_metrics"]) == {"train", "eval", "eval_mismatched"}


def check_lora_job(job: dict[str, Any]) -> None:
    result = job["result"]
    assert 0 < result["trainable_params"] < result["total_params"]
    output = Path(job["output_dir"])
    assert (output / "adapter_model.safetensors").is_file()
    assert (output / "merged" / "model.safetensors").is_file()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_postgres_fleet_database_runs_jobs_end_to_end(e2e_settings: Settings, tmp_path: Path) -> None:
    with live_api(e2e_settings) as client:
        good = submit(client, {**SMALL, "task_name": "mrpc", "num_train_epochs": 1})
        bad = submit(
            client,
            {
                **SMALL,
                "task_name": None,
                "train_file": "nowhere/train.csv",
                "validation_file": "nowhere/dev.csv",
            },
        )
        break_files_after_submission(e2e_settings)

        run_worker_until_idle(e2e_settings, tmp_path / "worker.log")

        done = get(client, f"/v1/jobs/{good['id']}")
        failed = get(client, f"/v1/jobs/{bad['id']}")
        assert done["status"] == "succeeded", done["error"]
        assert {r["name"] for r in all_metrics(client, good["id"]) if r["split"] == "eval"} == {
            "accuracy",
            "f1",
            "combined_score",
            "loss",
        }
        assert failed["status"] == "failed" and "nowhere/train.csv" in failed["error"]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_cancel_a_running_job_and_the_worker_goes_on(e2e_settings: Settings, tmp_path: Path) -> None:
    long_job = {
        **SMALL,
        "task_name": "sst2",
        "max_train_samples": 4000,
        "num_train_epochs": 20,
        "logging_steps": 1,
        "save_strategy": "no",
    }
    with live_api(e2e_settings) as client:
        job = submit(client, long_job)
        worker = start_worker(e2e_settings, log=tmp_path / "worker.log")
        try:
            wait_for(lambda: get(client, f"/v1/jobs/{job['id']}/metrics")["data"], timeout_s=120)

            response = client.post(f"/v1/jobs/{job['id']}/cancel")
            assert response.status_code == 202 and response.json()["status"] == "cancelling"
            cancelled = wait_for(
                lambda: (j := get(client, f"/v1/jobs/{job['id']}"))["status"] == "cancelled" and j,
                timeout_s=60,
            )
            assert cancelled["finished_at"] is not None

            follow_up = submit(client, {**SMALL, "task_name": "sst2", "max_train_samples": 16})
            wait_for(
                lambda: get(client, f"/v1/jobs/{follow_up['id']}")["status"] == "succeeded", timeout_s=180
            )
            assert worker.poll() is None  # still serving
        finally:
            os.killpg(worker.pid, signal.SIGTERM)
            assert worker.wait(60) == 0


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_two_process_job_through_accelerate_launch(e2e_settings: Settings, tmp_path: Path) -> None:
    """num_processes 2: `accelerate launch` runs two ranks (over gloo here, GPUs elsewhere); predictions
    are gathered from both and only rank 0 writes rows. No warm-start template: a two-process job
    starts fresh interpreters through `accelerate launch`, and the worker runs nothing else (the
    template's imports were about 8 of this test's 60 CPU-s)."""
    e2e_settings = e2e_settings.model_copy(update={"warm_start": False})
    with live_api(e2e_settings) as client:
        job = submit(
            client,
            {**SMALL, "task_name": "mrpc", "num_processes": 2, "max_eval_samples": 45, "logging_steps": 1},
        )

        # Two processes need two CPU slots: a worker with one would leave the job queued.
        run_worker_until_idle(e2e_settings, tmp_path / "worker.log", "--slots", "2")

        done = get(client, f"/v1/jobs/{job['id']}")
        assert done["status"] == "succeeded", done["error"]
        assert done["result"]["num_processes"] == 2
        rows = all_metrics(client, job["id"])
        # 64 rows over 2 ranks × batch 16 = 2 steps per epoch, 3 epochs.
        train_losses = [r for r in rows if r["split"] == "train" and r["name"] == "loss"]
        assert [r["step"] for r in train_losses] == [1, 2, 3, 4, 5, 6]
        learning_rates = [r["value"] for r in rows if r["name"] == "learning_rate"]
        assert learning_rates[-1] == pytest.approx(0.0, abs=1e-12)  # the schedule ends with the training
        # gather_for_metrics drops the padding a 45-row split gets on 2 ranks: accuracy is a multiple of 1/45.
        accuracy = [r["value"] for r in rows if r["name"] == "accuracy"]
        assert all(abs(a * 45 - round(a * 45)) < 1e-6 for a in accuracy)
        events = [e["message"] for e in get(client, f"/v1/jobs/{job['id']}/events")["data"]]
        assert sum(m.startswith("parameters:") for m in events) == 1
