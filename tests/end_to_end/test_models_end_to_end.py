"""A registered model trained by a real worker that has no GLUEJOBS_MODELS_DIR: fetched from the store
(moto's S3) into the worker's own cache by hash, again when the copy there is spoilt; and what
the user reads about the job (events, `gluejobs show`, `gluejobs watch`) names API paths and
download commands, never the worker's folders or the store's URIs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gluejobs import Client
from gluejobs.cli import main as cli
from shared.core.config import Settings
from shared.core.storage import open_store
from shared.model_folders.cache import cached_model
from tests.support.e2e import get, live_api, run_worker_until_idle
from tests.support.kit import QUICK_JOB, TINY_MODEL

pytestmark = pytest.mark.e2e


def test_a_worker_without_models_trains_a_registered_model_fetched_by_hash(
    settings_factory: Any,
    sqlite_url: str,
    s3_url: str,
    models_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    empty = tmp_path / "no-models"
    empty.mkdir()
    api: Settings = settings_factory(sqlite_url, storage_url=s3_url, models_dir=empty)
    open_store(api).check()
    # Another machine: its own (empty) models folder, cache and job folders.
    worker = api.model_copy(
        update={"cache_dir": tmp_path / "box2" / "cache", "artifacts_dir": tmp_path / "box2" / "artifacts"}
    )
    spec = {**QUICK_JOB, "model_name_or_path": "model:tiny", "save_strategy": "epoch"}
    with live_api(api) as http:
        url = str(http.base_url).rstrip("/")
        with Client(url) as client:
            model = client.models.upload(models_dir / TINY_MODEL, name="tiny")
            # The worker's disk holds a spoilt copy from before (truncated): it must not be loaded.
            cached = cached_model(open_store(worker), worker.cache_dir, model.sha256) / "model.safetensors"
            weights = cached.read_bytes()
            cached.write_bytes(weights[:100])
            job = client.jobs.create(spec)
            run_worker_until_idle(worker, tmp_path / "worker.log")

            job = client.jobs.get(job.id)
            assert job.status == "succeeded", job.error
            assert cached.read_bytes() == weights
            assert "corrupt or incomplete: fetching it again" in client.jobs.logs(job.id)
            recorded = job.raw["environment"]["model_files"]
            assert recorded == [{"role": "registered model", "source": "model:tiny", "sha256": model.sha256}]

            events = get(http, f"/v1/jobs/{job.id}/events")["data"]
            assert cli(["show", str(job.id), "--url", url]) == 0
            assert cli(["watch", str(job.id), "--url", url]) == 0
    said = [f"{e['message']} {json.dumps(e.get('data'))}" for e in events]
    shown = capsys.readouterr()
    assert any(f"gluejobs download {job.id} DIR" in line for line in said), said
    for text in [*said, shown.out, shown.err]:
        assert str(tmp_path) not in text and "s3://" not in text, text
    assert f"gluejobs download {job.id} DIR --checkpoint" in shown.out
