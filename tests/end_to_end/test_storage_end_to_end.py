"""No shared disk (issue 15), with real processes and a real S3 endpoint (moto's server):

- Two "machines": an API and two workers, each with folders of its own (artifacts, data, cache) and
  the S3 endpoint as the store. A CSV uploaded over HTTP, a job on its id; worker 1 trains past a
  checkpoint and is SIGKILLed; worker 2, whose cached copy of the file has its bytes flipped, fetches
  the file again, resumes from that checkpoint (at its step, not step 0) and the job succeeds; the
  model downloaded through the API loads with from_pretrained and predicts.
- The store unreachable for a few seconds while a job trains: it succeeds in its first attempt.
"""

from __future__ import annotations

import csv
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from gluejobs import Client
from shared.core.config import Settings
from shared.core.storage import open_store
from shared.jobspec.uploaded_files import cache_path
from tests.support.e2e import api_process, get, start_worker, submit, wait_for
from tests.support.kit import GLUE_DATA, TINY_MODEL
from tests.support.s3_endpoint import S3Endpoint

pytestmark = pytest.mark.e2e

SAVE_STEPS = 20
TRAIN_ROWS = 320  # 80 steps of batch 4


def _csv(path: Path, rows: list[list[str]]) -> Path:
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["sentence", "label"])
        writer.writerows(rows)
    return path


def _sst2_rows(count: int, skip: int = 0) -> list[list[str]]:
    lines = (GLUE_DATA / "SST-2" / "train.tsv").read_text().splitlines()[1 + skip : 1 + skip + count]
    return [line.split("\t") for line in lines]


def _machine(settings_factory: Any, tmp_path: Path, name: str, **overrides: Any) -> Settings:
    """The settings of one machine: folders of its own, the shared database and store."""
    root = tmp_path / name
    settings: Settings = settings_factory(
        overrides.pop("database_url"),
        artifacts_dir=root / "artifacts",
        data_dir=root / "data",
        cache_dir=root / "cache",
        **overrides,
    )
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    return settings


def _ended(client: httpx.Client, job_id: int) -> dict[str, Any]:
    job: dict[str, Any] = wait_for(
        lambda: (j := get(client, f"/v1/jobs/{job_id}"))["status"] in ("succeeded", "failed") and j,
        timeout_s=300,
    )
    return job


def _upload(client: httpx.Client, path: Path, purpose: str) -> dict[str, Any]:
    with path.open("rb") as handle:
        response = client.post("/v1/files", files={"file": (path.name, handle)}, data={"purpose": purpose})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def test_two_machines_without_a_shared_disk_resume_from_the_store_and_ride_out_its_outage(
    settings_factory: Any, postgres_url: str, s3_url: str, s3_endpoint: S3Endpoint, tmp_path: Path
) -> None:
    common = {"database_url": postgres_url, "storage_url": s3_url, "lease_s": 3.0, "heartbeat_s": 0.5}
    api, first, second = (
        _machine(settings_factory, tmp_path, name, **dict(common)) for name in ("api", "w1", "w2")
    )
    train = _csv(tmp_path / "mine.csv", _sst2_rows(TRAIN_ROWS))
    dev = _csv(tmp_path / "mine-dev.csv", _sst2_rows(32, skip=TRAIN_ROWS))
    with api_process(api, log=tmp_path / "api.log") as (client, _):
        train_file, dev_file = _upload(client, train, "train"), _upload(client, dev, "validation")
        spec = {
            "model_name_or_path": TINY_MODEL,
            "train_file": train_file["id"],
            "validation_file": dev_file["id"],
            "per_device_train_batch_size": 4,
            "num_train_epochs": 1,
            "learning_rate": 1e-3,
            "eval_strategy": "no",
            "save_strategy": "steps",
            "save_steps": SAVE_STEPS,
            "save_total_limit": 2,
            "logging_steps": 5,
            "seed": 5,
        }
        job = submit(client, spec)
        assert job["spec"]["uploaded_files"]["train_file"]["sha256"] == train_file["sha256"]
        assert {f["field"]: f["filename"] for f in job["data_files"]} == {
            "train_file": "mine.csv",
            "validation_file": "mine-dev.csv",
        }

        # Machine 1 trains past a checkpoint and dies (the worker and its job process).
        worker = start_worker(first, log=tmp_path / "w1.log")
        declared = wait_for(
            lambda: get(client, f"/v1/jobs/{job['id']}/checkpoints")["data"], timeout_s=180, interval_s=0.1
        )
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        # The newest checkpoint declared before the kill (one more may have been declared since the
        # poll above: uploads run beside training, so the next one may have landed meanwhile).
        step = get(client, f"/v1/jobs/{job['id']}/checkpoints")["data"][-1]["step"]
        assert declared[0]["path"].startswith(f"{s3_url}/jobs/{job['id']}/checkpoints/")

        # Machine 2 has a copy of the training file whose bytes were flipped.
        corrupt = cache_path(second.cache_dir, train_file["sha256"], ".csv")
        corrupt.parent.mkdir(parents=True)
        corrupt.write_bytes(bytes(b ^ 0xFF for b in train.read_bytes()))
        worker = start_worker(second, log=tmp_path / "w2.log")
        try:
            done = _ended(client, job["id"])
            assert done["status"] == "succeeded", done["error"]
            assert done["attempts"] == 2
            events = get(client, f"/v1/jobs/{job['id']}/events")["data"]
            resumed = [e for e in events if e["message"].startswith("resumed from")]
            # The second attempt continued at the checkpoint's step, not at step 0.
            assert [e["data"]["step"] for e in resumed] == [step] and resumed[0]["message"].startswith(
                f"resumed from checkpoint-{step} "
            )
            log = client.get(f"/v1/jobs/{job['id']}/logs", params={"attempt": 2}).text
            assert "corrupt or truncated: fetching it again" in log

            # The model, downloaded through the API (whose disk never saw a worker's), predicts.
            with Client(str(client.base_url)) as gluejobs:
                model_dir = gluejobs.jobs.download(job["id"], tmp_path / "downloaded")
                newest = gluejobs.jobs.checkpoints(job["id"])[-1].step
                folder = gluejobs.jobs.download(job["id"], tmp_path / "checkpoint", checkpoint=newest)
            assert (folder / f"checkpoint-{newest}" / "gluejobs_state.json").is_file()  # a tar from the store
            tokenizer = AutoTokenizer.from_pretrained(model_dir)
            model = AutoModelForSequenceClassification.from_pretrained(model_dir)
            with torch.no_grad():
                logits = model(**tokenizer(["a gorgeous, witty film"], return_tensors="pt")).logits
            assert logits.shape == (1, 2)
            # save_total_limit holds in the store; nothing is left on either worker's disk.
            kept = {c.path.split("/")[0] for c in open_store(api).list(f"jobs/{job['id']}/checkpoints")}
            assert len(kept) <= 2
            assert not second.job_dir(job["id"]).exists()
            assert not (api.artifacts_dir / "jobs").exists()

            # The store goes away for a few seconds while the next job trains: first attempt, success.
            again = submit(client, {**spec, "seed": 6})
            wait_for(
                lambda: get(client, f"/v1/jobs/{again['id']}/checkpoints")["data"],
                timeout_s=180,
                interval_s=0.1,
            )
            s3_endpoint.down()
            time.sleep(4)
            s3_endpoint.up()
            finished = _ended(client, again["id"])
            assert finished["status"] == "succeeded", finished["error"]
            assert finished["attempts"] == 1
        finally:
            s3_endpoint.up()
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(60)
