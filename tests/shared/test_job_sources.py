"""Another job's model as a spec's model (`job:N`, `job:N/checkpoint-S`, `job:N/best`) and promote
(POST /v1/jobs/{id}/model), on a real API over both databases without a worker: the job's folder is
written as a worker writes it (the tiny model's files and the manifest worker/training/model_manifest.py
writes), and the job is finished as a worker finishes it (tests/dbutil.finish_as_a_worker)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from gluejobs import ApiError, AsyncClient, Client
from gluejobs.cli import main as cli
from shared.core.config import Settings
from shared.core.db import Database
from shared.core.storage import model_blob_key, model_manifest_key, open_store
from shared.jobs_repo.model_objects import pin_key, sweep_model_orphans
from shared.jobspec.registered_models import manifest_sha256
from shared.wire.job_folder import MANIFEST_NAME
from tests.support.dbutil import finish_as_a_worker
from tests.support.e2e import live_api
from tests.support.kit import ALICE, BOB, ROOT, TINY_MODEL, auth
from worker.training.model_manifest import write_model_manifest

SPEC = {"model_name_or_path": TINY_MODEL, "task_name": "sst2", "max_train_samples": 16}


def _model_folder(source: Path, folder: Path) -> None:
    """What a worker leaves in a folder it saved a model to, with what is not the model beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        shutil.copy(path, folder / path.name)
    (folder / "all_results.json").write_text("{}")  # a job's results: not the model's
    (folder / "optimizer.bin").write_bytes(b"state")  # a checkpoint's optimizer: not the model's
    write_model_manifest(folder)


def test_a_job_starts_from_another_jobs_model_owned_pinned_and_promoted(
    settings_factory: Any, db_url: str, db: Database, models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings: Settings = settings_factory(
        db_url,
        api_keys=[f"alice={ALICE}", f"bob={BOB}"],
        admin_keys=[f"root={ROOT}"],
        check_data_on_submit=False,  # the data is not what is tested: no reading of it per submission
    )
    store = open_store(settings)
    with live_api(settings) as http:
        alice, bob, root = auth(ALICE), auth(BOB), auth(ROOT)

        def submit(model: str, headers: dict[str, str] = alice) -> httpx.Response:
            return http.post(
                "/v1/jobs", json={"spec": {**SPEC, "model_name_or_path": model}}, headers=headers
            )

        source = http.post("/v1/jobs", json={"spec": SPEC}, headers=alice).json()["id"]
        lora = http.post("/v1/jobs", json={"spec": {**SPEC, "apply_lora": True}}, headers=alice).json()["id"]
        merged = http.post(
            "/v1/jobs", json={"spec": {**SPEC, "apply_lora": True, "save_merged_model": True}}, headers=alice
        ).json()["id"]

        # Queued: no final model, no checkpoint yet (409, saying why); a malformed name is 422.
        early = submit(f"job:{source}")
        assert early.status_code == 409, early.text
        assert "final model exists once it has succeeded" in early.json()["error"]["message"]
        assert submit(f"job:{source}/best").status_code == 409
        bad = submit(f"job:{source}/latest")
        assert bad.status_code == 422 and "job:ID/best" in bad.json()["error"]["message"]

        # The worker's folder: the final model at the top, a checkpoint at step 4 (the best).
        job_dir = settings.job_dir(source)
        _model_folder(models_dir / TINY_MODEL, job_dir)
        _model_folder(models_dir / TINY_MODEL, job_dir / "checkpoints" / "checkpoint-4")
        finish_as_a_worker(db, source, {"accuracy": 0.5}, checkpoint="checkpoint-4")
        finish_as_a_worker(db, lora, {"accuracy": 0.5})
        _model_folder(models_dir / TINY_MODEL, settings.job_dir(merged) / "merged")
        finish_as_a_worker(db, merged, {"accuracy": 0.5})
        manifest = (job_dir / MANIFEST_NAME).read_bytes()
        files = write_model_manifest(job_dir)
        assert {f.path for f in files} >= {"config.json", "model.safetensors", "tokenizer.json"}
        assert not {"all_results.json", "optimizer.bin", MANIFEST_NAME} & {f.path for f in files}
        sha256 = manifest_sha256(files)

        # A dry run stores no job, so it pins nothing (what it copied is swept unless a job comes to
        # hold it); a spec refused for another field neither.
        spec = {**SPEC, "model_name_or_path": f"job:{source}"}
        planned = http.post("/v1/jobs", params={"dry_run": "true"}, json={"spec": spec}, headers=alice)
        assert planned.status_code == 200, planned.text
        refused_spec = http.post("/v1/jobs", json={"spec": {**spec, "no_such_field": 1}}, headers=alice)
        assert refused_spec.status_code == 422, refused_spec.text
        assert not store.exists(pin_key(sha256))

        # The final model: pinned by its manifest's hash, its files copied by the store to their blobs.
        chained = submit(f"job:{source}")
        assert chained.status_code == 201, chained.text
        record = chained.json()["spec"]["registered_model"]
        size = sum(f.bytes for f in files)
        assert record == {
            "name": f"job-{source}",
            "owner": "alice",
            "sha256": sha256,
            "bytes": size,
            "job": source,
        }
        assert store.read(model_manifest_key(sha256)) == manifest == store.read(pin_key(sha256))
        assert all(store.exists(model_blob_key(f.sha256)) for f in files)
        best = submit(f"job:{source}/best").json()["spec"]["registered_model"]
        assert (best["checkpoint"], best["sha256"]) == ("checkpoint-4", sha256)  # the same bytes
        assert submit(f"job:{source}/checkpoint-4").json()["spec"]["registered_model"] == best
        missing = submit(f"job:{source}/checkpoint-9")
        assert missing.status_code == 422, missing.text
        assert (
            "no checkpoint at step 9; its declared checkpoints are at steps 4"
            in missing.json()["error"]["message"]
        )
        # A LoRA job's adapter is not a full model to register (a spec may name it: test_lora_sources).
        refused = http.post(f"/v1/jobs/{lora}/model", json={"name": "adapter"}, headers=alice)
        assert refused.status_code == 422 and "LoRA adapter" in refused.json()["error"]["message"]
        from_merged = submit(f"job:{merged}").json()["spec"]["registered_model"]  # a LoRA job's merged model
        assert (from_merged["job"], from_merged["sha256"]) == (merged, sha256)

        # Another owner: not found, in the words of a job that does not exist; an admin: anyone's.
        hidden = submit(f"job:{source}", bob)
        assert hidden.status_code == 404, hidden.text
        nowhere = submit("job:999999", bob).json()["error"]["message"]
        assert hidden.json()["error"]["message"] == nowhere.replace("999999", str(source))
        assert hidden.json()["error"]["field"] == "spec.model_name_or_path"
        assert submit(f"job:{source}", root).json()["spec"]["registered_model"]["sha256"] == sha256

        # Promote: the final model, then the best checkpoint, as GET /v1/models/{name} answers them.
        promoted = http.post(f"/v1/jobs/{source}/model", json={"name": "from-job"}, headers=alice)
        assert promoted.status_code == 201, promoted.text
        view = promoted.json()
        assert (view["model_name_or_path"], view["sha256"], view["model_type"]) == (
            "model:from-job",
            sha256,
            "bert",
        )
        assert http.get("/v1/models/from-job", headers=alice).json() == view
        again = http.post(f"/v1/jobs/{source}/model", json={"name": "from-job"}, headers=alice)
        assert again.status_code == 409 and again.json()["error"]["field"] == "name"
        assert (
            http.post(f"/v1/jobs/{source}/model", json={"name": "b", "checkpoint": "best"}, headers=alice)
        ).status_code == 201
        no_step = http.post(f"/v1/jobs/{source}/model", json={"name": "c", "checkpoint": "7"}, headers=alice)
        assert no_step.status_code == 422 and no_step.json()["error"]["field"] == "checkpoint"
        assert http.post(f"/v1/jobs/{source}/model", json={"name": "x"}, headers=bob).status_code == 404
        named = submit("model:from-job").json()
        assert named["spec"]["registered_model"]["sha256"] == sha256
        assert http.post(f"/v1/jobs/{named['id']}/cancel", headers=alice).status_code in (200, 202)

        # The client (both) and the command line promote too; another owner gets 404 there as well.
        url = str(http.base_url)
        with Client(url, api_key=ALICE) as client:
            assert client.models.promote(source, name="by-client", checkpoint=4).sha256 == sha256
        with Client(url, api_key=BOB) as client, pytest.raises(ApiError) as not_bobs:
            client.models.promote(source, name="mine")
        assert not_bobs.value.status_code == 404

        async def promote_async() -> str:
            async with AsyncClient(url, api_key=ALICE) as client:
                return (await client.models.promote(source, name="by-async", checkpoint="best")).sha256

        assert asyncio.run(promote_async()) == sha256
        capsys.readouterr()
        argv = ["models", "promote", f"job:{source}", "--name", "by-cli", "--url", url, "--api-key", ALICE]
        assert cli([*argv, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["model_name_or_path"] == "model:by-cli"

        # The pin keeps the bytes through the models' deletion and the sweep.
        for name in ("from-job", "b", "by-client", "by-async", "by-cli"):
            assert http.delete(f"/v1/models/{name}", headers=alice).status_code == 200
        sweep_model_orphans(db, store, grace_s=0)
        assert store.exists(model_manifest_key(sha256))
        assert all(store.exists(model_blob_key(f.sha256)) for f in files)

        # A model saved before workers wrote manifests: hashed by the API, the same hash.
        (job_dir / MANIFEST_NAME).unlink()
        old = http.post(f"/v1/jobs/{source}/model", json={"name": "old"}, headers=alice)
        assert old.status_code == 201 and old.json()["sha256"] == sha256, old.text
