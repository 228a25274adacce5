"""The three recipes end to end: submitted with `gluejobs submit` as the user has them, over real
HTTP, run by a real worker (two CPU processes for the LoRA configs), shrunk to tiny models of the
same families and a few steps on an MNLI fixture."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from gluejobs.cli import main
from shared.core.config import Settings
from tests.support.e2e import all_metrics, get, live_api, run_worker_until_idle
from tests.support.kit import REPO, TINY_DEBERTA_V2, TINY_MODEL, TINY_ROBERTA, write_mnli
from tests.support.lora_scripts import DEBERTA_V2_XXLARGE_MNLI, ROBERTA_BASE_MNLI

pytestmark = pytest.mark.e2e

# The Trainer page's arguments (own sentiment CSVs, F1, best model by F1, eval and save per epoch),
# shrunk: fewer rows and a learning rate a tiny random model learns from.
TRAINER_PAGE_ARGS = {
    "model_name_or_path": TINY_MODEL,
    "train_file": "reviews/train.csv",
    "validation_file": "reviews/validation.csv",
    "output_dir": "my_awesome_model",
    "learning_rate": 3e-3,
    "per_device_train_batch_size": 16,
    "per_device_eval_batch_size": 16,
    "num_train_epochs": 3,
    "weight_decay": 0.01,
    "eval_strategy": "epoch",
    "save_strategy": "epoch",
    "load_best_model_at_end": True,
    "metric_for_best_model": "f1",
    "push_to_hub": False,
    "report_to": ["tensorboard"],
    "max_train_samples": 64,
    "max_eval_samples": 40,
}


@pytest.fixture
def recipe_settings(settings_factory, sqlite_url: str, tmp_path: Path) -> Settings:  # type: ignore[no-untyped-def]
    glue = tmp_path / "glue"
    write_mnli(glue / "MNLI")
    settings: Settings = settings_factory(sqlite_url, glue_dir=glue)
    reviews = settings.data_dir / "reviews"
    reviews.mkdir(parents=True)
    for split in ("train", "validation"):
        shutil.copy(
            REPO / "gluejobs_server" / "demo_data" / f"sentiment_{split}.csv", reviews / f"{split}.csv"
        )
    return settings


def submit_with_cli(capsys: pytest.CaptureFixture[str], *args: str) -> int:
    assert main(["submit", *args]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    match = re.search(r"job (\d+) queued", out)
    assert match, out
    return int(match.group(1))


def test_the_lora_configs_and_the_trainer_page_run_as_pasted(
    recipe_settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "roberta_base_mnli.sh").write_text(ROBERTA_BASE_MNLI)
    (tmp_path / "deberta_v2_xxlarge_mnli.sh").write_text(DEBERTA_V2_XXLARGE_MNLI)
    (tmp_path / "trainer_page.json").write_text(json.dumps(TRAINER_PAGE_ARGS))
    # Shrunk: tiny models of the same families, two CPU processes, short sequences, a few steps.
    shrink = ["--num_processes", "2", "--max_seq_length", "64", "--num_train_epochs", "1"]
    with live_api(recipe_settings) as client:
        url = ["--url", str(client.base_url)]
        roberta = submit_with_cli(
            capsys, "--script", str(tmp_path / "roberta_base_mnli.sh"), *url,
            "--model_name_or_path", TINY_ROBERTA, *shrink,
        )  # fmt: skip
        deberta = submit_with_cli(
            capsys, "--script", str(tmp_path / "deberta_v2_xxlarge_mnli.sh"), *url,
            "--model_name_or_path", TINY_DEBERTA_V2, *shrink, "--fp16", "false",  # no GPU here
            "--eval_steps", "1", "--save_steps", "1", "--logging_steps", "1",
        )  # fmt: skip
        trainer_page = submit_with_cli(capsys, "--config", str(tmp_path / "trainer_page.json"), *url)

        run_worker_until_idle(recipe_settings, tmp_path / "worker.log", "--slots", "2")  # 2-process jobs

        jobs = {name: get(client, f"/v1/jobs/{job_id}") for name, job_id in
                (("roberta", roberta), ("deberta", deberta), ("trainer_page", trainer_page))}  # fmt: skip
        assert {name: job["status"] for name, job in jobs.items()} == dict.fromkeys(jobs, "succeeded"), {
            name: job["error"] for name, job in jobs.items()
        }
        check_roberta_lora(client, jobs["roberta"], recipe_settings)
        check_deberta_lora(client, jobs["deberta"])
        check_trainer_page(client, jobs["trainer_page"])


def check_roberta_lora(client: Any, job: dict[str, Any], settings: Settings) -> None:
    from peft import PeftModel

    spec, result = job["spec"], job["result"]
    assert (spec["recipe"], spec["num_processes"], spec["max_grad_norm"], spec["lora_r"]) == (
        "trainer",
        2,
        1.0,
        8,
    )
    assert result["num_processes"] == 2 and 0 < result["lora_params"] < result["trainable_params"]
    rows = all_metrics(client, job["id"])
    # 48 MNLI rows / (2 processes × 16) = 2 steps; Trainer clips, so the train rows carry grad_norm.
    assert {r["name"] for r in rows if r["split"] == "train"} == {"loss", "learning_rate", "grad_norm"}
    assert [r["step"] for r in rows if r["split"] == "eval_mismatched" and r["name"] == "accuracy"] == [2]
    [checkpoint] = get(client, f"/v1/jobs/{job['id']}/checkpoints")["data"]
    folder = Path(checkpoint["path"])
    base = AutoModelForSequenceClassification.from_pretrained(
        settings.models_dir / TINY_ROBERTA, num_labels=3
    )
    model = PeftModel.from_pretrained(base, folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        logits = model(
            **tokenizer(["A man plays.", "Nobody plays."], return_tensors="pt", padding=True)
        ).logits
    assert logits.shape == (2, 3)


def check_deberta_lora(client: Any, job: dict[str, Any]) -> None:
    spec = job["spec"]
    assert (spec["cls_dropout"], spec["use_deterministic_algorithms"], spec["num_warmup_steps"]) == (
        0.15,
        True,
        1000,
    )
    events = get(client, f"/v1/jobs/{job['id']}/events")["data"]
    [determinism] = [e for e in events if e["message"].startswith("deterministic algorithms on")]
    # Both variables reached the job's processes from the worker, before they started.
    assert determinism["data"] == {"CUBLAS_WORKSPACE_CONFIG": ":16:8", "PYTHONHASHSEED": "0"}
    rows = all_metrics(client, job["id"])
    # 48 rows / (2 × 8) = 3 steps, evaluated and saved after each (eval_steps/save_steps 1).
    assert [r["step"] for r in rows if r["split"] == "eval" and r["name"] == "accuracy"] == [1, 2, 3]
    checkpoints = get(client, f"/v1/jobs/{job['id']}/checkpoints")["data"]
    assert [c["step"] for c in checkpoints] == [1, 2, 3]
    # The adapter holds the pooler beside the classifier: DeBERTa's pooler sits outside the backbone
    # and trains, as in the recipe.
    adapter = load_file(Path(job["output_dir"]) / "adapter_model.safetensors")
    assert any(".pooler." in key for key in adapter) and any(".classifier." in key for key in adapter)
    config = json.loads((Path(checkpoints[-1]["path"]) / "adapter_config.json").read_text())
    assert set(config["modules_to_save"]) >= {"pooler", "classifier"}


def check_trainer_page(client: Any, job: dict[str, Any]) -> None:
    rows = all_metrics(client, job["id"])
    f1 = {r["step"]: r["value"] for r in rows if r["split"] == "eval" and r["name"] == "f1"}
    assert sorted(f1) == [4, 8, 12]  # 64 rows / 16 = 4 steps an epoch, 3 epochs
    best_step = max(f1, key=lambda step: (f1[step], -step))  # the first of equals, as Trainer keeps it
    assert job["best_metrics"]["metric"] == "f1" and job["best_metrics"]["step"] == best_step
    assert job["result"]["best_step"] == best_step
    checkpoints = get(client, f"/v1/jobs/{job['id']}/checkpoints")["data"]
    assert [c["step"] for c in checkpoints] == [4, 8, 12]
    assert [c["step"] for c in checkpoints if c["is_best"]][-1] == best_step
    # load_best_model_at_end: the job's model is the best checkpoint's, and both load and predict.
    best_folder = Path(next(c["path"] for c in checkpoints if c["step"] == best_step))
    output = Path(job["output_dir"])
    best_weights, final_weights = (
        load_file(best_folder / "model.safetensors"),
        load_file(output / "model.safetensors"),
    )
    assert all(torch.equal(best_weights[name], final_weights[name]) for name in best_weights)
    model = AutoModelForSequenceClassification.from_pretrained(best_folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(best_folder)
    with torch.no_grad():
        assert model(**tokenizer(["Great service!"], return_tensors="pt")).logits.shape == (1, 2)
    assert list((output / "tensorboard").rglob("events.out.tfevents.*"))
    assert os.path.isdir(output / "checkpoints")
