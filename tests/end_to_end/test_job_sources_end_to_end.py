"""A job from another job's model on real processes and moto's S3 (issue 33 items 1 and 4): an API with
two owners' keys and one worker; a tiny job trains, a job starting from `job:N` pins its model by hash,
loads it (its evaluation, with a learning rate too small to move a weight, is the first job's final
evaluation on the same rows, loss included) and succeeds; the model is promoted; another owner gets
404 for both."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from gluejobs import ApiError, Client
from shared.core.config import Settings
from shared.core.storage import model_manifest_key, open_store
from shared.jobs_repo.model_objects import pin_key
from shared.wire.job_folder import MANIFEST_NAME, job_key
from tests.support.e2e import api_process, get, start_worker, submit, wait_for
from tests.support.kit import ALICE, BOB, TINY_MODEL, auth

pytestmark = pytest.mark.e2e

SPEC = {
    "model_name_or_path": TINY_MODEL,
    "task_name": "sst2",
    "max_train_samples": 32,
    "max_eval_samples": 32,
    "per_device_train_batch_size": 8,
    "num_train_epochs": 1,
    "learning_rate": 1e-3,
    "logging_steps": 2,
    "seed": 3,
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


def _evaluations(client: httpx.Client, job_id: int, name: str) -> list[float]:
    rows = get(client, f"/v1/jobs/{job_id}/metrics", limit=1000)["data"]
    return [row["value"] for row in rows if (row["split"], row["name"]) == ("eval", name)]


def test_a_job_trains_on_from_another_jobs_model_in_the_store_pinned_and_promoted(
    settings_factory: Any, sqlite_url: str, s3_url: str, tmp_path: Path
) -> None:
    settings: Settings = settings_factory(
        sqlite_url, storage_url=s3_url, api_keys=[f"alice={ALICE}", f"bob={BOB}"], poll_interval_s=0.2
    )
    store = open_store(settings)
    with api_process(settings, log=tmp_path / "api.log") as (client, _):
        client.headers.update(auth(ALICE))
        worker = start_worker(settings, log=tmp_path / "worker.log")
        try:
            first = _ended(client, submit(client, SPEC)["id"])
            manifest = store.read(job_key(first["id"], MANIFEST_NAME))

            chained = submit(
                client, {**SPEC, "model_name_or_path": f"job:{first['id']}", "learning_rate": 1e-12}
            )
            record = chained["spec"]["registered_model"]
            assert (record["job"], record["owner"]) == (first["id"], "alice")
            assert (
                store.read(model_manifest_key(record["sha256"]))
                == manifest
                == store.read(pin_key(record["sha256"]))
            )
            _ended(client, chained["id"])
            # Its first evaluation is the first job's last: the same weights on the same rows (the loss
            # to a few parts in a million: a freshly drawn classifier would be far off).
            for name in ("accuracy", "loss"):
                reached = _evaluations(client, chained["id"], name)[0]
                assert reached == pytest.approx(_evaluations(client, first["id"], name)[-1], rel=1e-5)
        finally:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()

        url = str(client.base_url)
        with Client(url, api_key=ALICE) as alice, Client(url, api_key=BOB) as bob:
            promoted = alice.models.promote(first["id"], name="chained")
            assert (promoted.sha256, promoted.model_type) == (record["sha256"], "bert")
            for refused in (
                lambda: bob.jobs.create({**SPEC, "model_name_or_path": f"job:{first['id']}"}),
                lambda: bob.models.promote(first["id"], name="mine"),
            ):
                with pytest.raises(ApiError) as hidden:
                    refused()
                assert (
                    hidden.value.status_code == 404 and f"job {first['id']} not found" in hidden.value.message
                )
