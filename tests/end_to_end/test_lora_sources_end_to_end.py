"""A LoRA job's adapter as a source (issue 33 item 3) on real processes (SQLite, the local store): a tiny
LoRA job trains; an evaluation job from `job:N` (its final adapter) and one from `job:N/checkpoint-S`
load the adapter on its base, pinned in the stored spec, and reproduce the job's own final evaluation;
a training job from the adapter starts from the merged model (a new adapter on it: with a learning
rate too small to move a weight, its evaluation is the first job's). In the test process, PEFT loads
the adapter the job stored, and the merged model `gluejobs download --merged` fetched (a job that saved
it on request) loads with from_pretrained and gives the same logits."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from gluejobs.cli import main as cli
from shared.core.config import Settings
from shared.core.storage import open_store
from shared.wire.job_folder import job_key
from tests.support.e2e import api_process, get, start_worker, submit, wait_for
from tests.support.kit import TINY_MODEL

pytestmark = pytest.mark.e2e

SPEC = {
    "model_name_or_path": TINY_MODEL,
    "task_name": "sst2",
    "max_train_samples": 32,
    "max_eval_samples": 32,
    "per_device_train_batch_size": 8,
    "num_train_epochs": 1,
    "learning_rate": 5e-2,
    "apply_lora": True,
    "lora_r": 4,
    "seed": 3,
}
EVAL = {
    "model_name_or_path": "",
    "task_name": "sst2",
    "max_eval_samples": 32,
    "do_train": False,
    "do_eval": True,
}


def _ended(client: httpx.Client, job_id: int) -> dict[str, Any]:
    job: dict[str, Any] = wait_for(
        lambda: (
            (j := get(client, f"/v1/jobs/{job_id}"))["status"] in ("succeeded", "failed", "cancelled") and j
        ),
        timeout_s=300,
    )
    assert job["status"] == "succeeded", job.get("error")
    return job


def _evaluations(client: httpx.Client, job_id: int) -> dict[str, list[float]]:
    rows = get(client, f"/v1/jobs/{job_id}/metrics", limit=1000)["data"]
    found: dict[str, list[float]] = {}
    for row in rows:
        if row["split"] == "eval" and row["name"] in ("accuracy", "loss"):
            found.setdefault(row["name"], []).append(row["value"])
    return found


def test_a_lora_jobs_adapter_is_evaluated_and_trained_on_from_its_base(
    settings_factory: Any, sqlite_url: str, tmp_path: Path, models_dir: Path
) -> None:
    settings: Settings = settings_factory(sqlite_url, poll_interval_s=0.2)
    store = open_store(settings)
    with api_process(settings, log=tmp_path / "api.log") as (client, _):
        worker = start_worker(settings, log=tmp_path / "worker.log")
        try:
            lora = _ended(client, submit(client, SPEC)["id"])
            step = lora["result"]["completed_steps"]
            sources = [f"job:{lora['id']}", f"job:{lora['id']}/checkpoint-{step}"]
            evaluations = [submit(client, {**EVAL, "model_name_or_path": source}) for source in sources]
            trained = submit(
                client, {**SPEC, "model_name_or_path": sources[0], "learning_rate": 1e-12, "lora_r": 2}
            )
            for job in (*evaluations, trained):
                record = job["spec"]["registered_model"]
                # The adapter by its hash, and the base it goes on as the LoRA job named it.
                assert (record["job"], record["base_model_name_or_path"]) == (lora["id"], TINY_MODEL)
                assert "base_model" not in record  # a base under GLUEJOBS_MODELS_DIR has no stored record
            final = _evaluations(client, lora["id"])
            for job in (*evaluations, trained):
                _ended(client, job["id"])
                reached = _evaluations(client, job["id"])
                assert reached["accuracy"][-1] == final["accuracy"][-1]
                assert reached["loss"][-1] == pytest.approx(final["loss"][-1], rel=1e-5)
            # The merged model on request: the command line queues the job that merges the checkpoint's
            # adapter into its base (an evaluation job with save_merged_model), waits, downloads merged/.
            argv = [
                "download",
                str(lora["id"]),
                str(tmp_path / "merged"),
                "--merged",
                "--checkpoint",
                str(step),
            ]
            assert cli([*argv, "--url", str(client.base_url)]) == 0
        finally:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
    # The adapter as a download holds: PEFT loads it on its base; the worker's merge predicts the same.
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    for name in (
        "adapter_config.json",
        "adapter_model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ):
        (adapter / name).write_bytes(store.read(job_key(lora["id"], name)))
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    base = AutoModelForSequenceClassification.from_pretrained(models_dir / TINY_MODEL, num_labels=2)
    peft_model = PeftModel.from_pretrained(base, str(adapter)).eval()
    # The merged download: a full model, with the task's label names.
    merged = AutoModelForSequenceClassification.from_pretrained(tmp_path / "merged" / "merged").eval()
    assert merged.config.id2label == {0: "negative", 1: "positive"}
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "merged" / "merged")
    batch = tokenizer(["a gripping, funny film", "dull and far too long"], return_tensors="pt", padding=True)
    with torch.no_grad():
        assert torch.allclose(peft_model(**batch).logits, merged(**batch).logits, atol=1e-5)
