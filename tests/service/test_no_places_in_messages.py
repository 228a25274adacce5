"""No message a user reads names a store endpoint, bucket or prefix, a path on a worker or a
traceback frame; operators find those in their logs (issue 32, item 10).

- The S3 store away (tests/support/s3_endpoint.py's relay cuts it): every route that needs it answers 503
  `storage_unavailable` naming what could not be done, and the API's log names the endpoint.
- A job that fails in the worker (a model folder whose config does not parse): its `error` and its
  events hold the cause with the model's name, and no traceback, site-packages or worker folder,
  while the job's log file keeps the traceback and the worker's log the cause as it was raised.
"""

from __future__ import annotations

import json
import logging
import traceback
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.main import create_app
from shared.core.config import Settings
from shared.core.storage import open_store
from shared.jobspec.spec import JobSpec
from tests.support.e2e import LOOPBACK_URL, live_api, run_worker_until_idle, submit
from tests.support.kit import ALICE, TINY_MODEL, auth
from tests.support.s3_endpoint import S3Endpoint
from worker.training.user_text import drop_tracebacks, for_users, places_of

TRAIN = b"sentence,label\n" + b"".join(f"a fine sentence number {i},{i % 2}\n".encode() for i in range(40))
PREFIX = "gj-private-prefix"  # a prefix no sentence of ours would contain by chance


def _places_of_the_store(settings: Settings, endpoint: S3Endpoint) -> list[str]:
    assert settings.storage_url is not None
    bucket = settings.storage_url.removeprefix("s3://").split("/")[0]
    return ["s3://", bucket, PREFIX, endpoint.url, f":{endpoint.port}", "127.0.0.1"]


# One database: the answers are the API's, above it; Postgres with the S3 store down is
# tests/service/test_user_views_have_no_places.py's outage walk of every GET route (issue 36, item 7).
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_store_outage_answers_503_naming_no_endpoint_bucket_or_prefix(
    settings_factory: Any,
    db_url: str,
    s3_url: str,
    s3_endpoint: S3Endpoint,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings: Settings = settings_factory(
        db_url, storage_url=f"{s3_url.rsplit('/', 1)[0]}/{PREFIX}", storage_retry_s=1.0, api_keys=[ALICE]
    )
    open_store(settings).check()
    places = _places_of_the_store(settings, s3_endpoint)
    with TestClient(create_app(settings), base_url=LOOPBACK_URL) as client:
        file = client.post("/v1/files", files={"file": ("train.csv", TRAIN)}, headers=auth(ALICE))
        assert file.status_code == 201, file.text
        spec = {"model_name_or_path": TINY_MODEL, "train_file": file.json()["id"], "eval_strategy": "no"}
        job = client.post("/v1/jobs", json={"spec": spec}, headers=auth(ALICE))
        assert job.status_code == 201, job.text
        job_id, file_id = job.json()["id"], file.json()["id"]

        s3_endpoint.down()
        try:
            with caplog.at_level(logging.WARNING):
                answers = {
                    "upload": client.post(
                        "/v1/files", files={"file": ("other.csv", TRAIN + b"x,1\n")}, headers=auth(ALICE)
                    ),
                    "file content": client.get(f"/v1/files/{file_id}/content", headers=auth(ALICE)),
                    "artifacts": client.get(f"/v1/jobs/{job_id}/artifacts", headers=auth(ALICE)),
                    "logs": client.get(f"/v1/jobs/{job_id}/logs", headers=auth(ALICE)),
                }
        finally:
            s3_endpoint.up()

    for what, answer in answers.items():
        assert answer.status_code == 503, (what, answer.text)
        error = answer.json()["error"]
        assert error["code"] == "storage_unavailable", (what, error)
        assert error["message"].startswith("the file store did not answer for 1 s (could not "), error
        leaked = [place for place in places if place in answer.text]
        assert not leaked, (what, leaked, answer.text)
    # The operator's log has what the driver said: botocore's "Could not connect to the endpoint URL".
    gave_up = [r.getMessage() for r in caplog.records if "giving up" in r.getMessage()]
    assert len(gave_up) >= len(answers), [r.getMessage() for r in caplog.records]
    assert all(s3_endpoint.url in line for line in gave_up), gave_up


@pytest.fixture
def broken_models(settings_factory: Any, tmp_path: Path, models_dir: Path) -> Path:
    """A models folder of this test's own: the tiny model, and one whose config does not parse."""
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / TINY_MODEL).symlink_to(models_dir / TINY_MODEL, target_is_directory=True)
    broken = folder / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "bert", "hidden_size": "not a number"')
    return folder


@pytest.mark.e2e  # a live API and a real worker
# One database: a failed job's error and events are worded above the database, whose writes have
# their tests on both; a second end-to-end run repeated the same API and worker (issue 36, item 7).
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_failed_jobs_error_and_events_name_no_frame_and_no_worker_folder(
    settings_factory: Any, db_url: str, broken_models: Path, tmp_path: Path
) -> None:
    settings: Settings = settings_factory(db_url, models_dir=broken_models)
    worker_log = tmp_path / "worker.log"
    with live_api(settings) as client:
        job = submit(
            client, {"model_name_or_path": "broken-model", "task_name": "sst2", "max_train_samples": 8}
        )
        run_worker_until_idle(settings, worker_log)
        failed = client.get(f"/v1/jobs/{job['id']}").json()
        events = client.get(f"/v1/jobs/{job['id']}/events").json()["data"]

    assert failed["status"] == "failed" and failed["error_code"] == "model_load_failed", failed["error"]
    error = failed["error"]
    assert "broken-model" in error and "last log lines:" in error, error  # the cause, in the user's words
    folders = [str(p) for p in (broken_models, settings.cache_dir, settings.artifacts_dir, tmp_path)]
    readable = "\n".join([error, json.dumps(events)])
    for mark in ["Traceback", 'File "', "/site-packages/", str(Path.home()), *folders]:
        assert mark not in readable, (mark, readable)
    [ended] = [e for e in events if e["data"].get("status") == "failed"]
    assert ended["message"].startswith("job failed [model_load_failed]: could not load the tokenizer"), ended
    assert "'broken-model/config.json' is not a valid JSON file" in ended["message"], ended

    # The operators' logs keep what the user's messages leave out.
    job_log = (settings.job_dir(job["id"]) / "logs" / "attempt-1.log").read_text()
    assert "Traceback (most recent call last):" in job_log and "/site-packages/" in job_log
    assert str(broken_models) in worker_log.read_text()


def _raised_in_a_library(site_packages: Path) -> str:
    """A chained traceback whose frames are in `site_packages`, as the job's process logs one."""
    code = compile("def load():\n    raise ValueError('bad json')\n", str(site_packages / "lib.py"), "exec")
    scope: dict[str, Any] = {}
    exec(code, scope)
    try:
        try:
            scope["load"]()
        except ValueError as exc:
            raise OSError("It looks like the config file is not valid") from exc
    except OSError:
        return traceback.format_exc()
    raise AssertionError("not raised")


def test_tracebacks_go_and_each_exceptions_last_line_stays(tmp_path: Path) -> None:
    logged = "12:00 ERROR worker.fleet.child: job 3 failed: it broke\n" + _raised_in_a_library(
        tmp_path / "lib" / "site-packages"
    )
    assert "Traceback" in logged and 'File "' in logged  # what the job's log file keeps

    kept = drop_tracebacks(logged)
    assert kept.splitlines() == [
        "12:00 ERROR worker.fleet.child: job 3 failed: it broke",
        "ValueError: bad json",
        "",
        "OSError: It looks like the config file is not valid",
    ]
    assert drop_tracebacks(kept) == kept


def test_worker_paths_become_what_the_user_named(
    settings_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://10.1.2.3:9000")
    settings: Settings = settings_factory(
        "sqlite://",
        data_dir=tmp_path / "data",
        cache_dir=tmp_path / "cache",
        storage_url="s3://team-store/gj",
    )
    sha_file, sha_model = "a" * 64, "b" * 64
    spec = JobSpec.model_validate(
        {
            "model_name_or_path": "model:mine",
            "registered_model": {"name": "mine", "sha256": sha_model, "bytes": 1},
            "train_file": "file-7",
            "eval_strategy": "no",
            "uploaded_files": {
                "train_file": {
                    "id": "file-7",
                    "filename": "my.csv",
                    "bytes": 1,
                    "sha256": sha_file,
                }
            },
        }
    )
    job_dir = settings.job_dir(7)
    places = places_of(settings, [job_dir], spec)
    hub = Path.home() / ".cache/huggingface/hub/models--org--bert-x/snapshots/0123abc/vocab.txt"
    said = (
        f"no rows in '{settings.cache_dir}/files/aa/{sha_file}.csv'; "
        f"tokenizer of {settings.cache_dir}/models/{sha_model}/tokenizer.json; "
        f"config '{settings.models_dir}/tiny/config.json' and '{settings.data_dir}/sst2/train.csv'. "
        f"wrote {job_dir}/checkpoints/checkpoint-5; read {hub}; "
        "raised at /usr/lib/python3.12/site-packages/transformers/utils/hub.py:470; "
        "see https://huggingface.co/docs/hub/a and /v1/jobs/7/logs; 3/4 and/or; "
        "no team-store/gj/jobs/7/model.safetensors, nor s3://team-store/gj/files/ab; "
        'reset at "http://10.1.2.3:9000/team-store/gj/jobs/7"'
    )

    assert for_users(said, places) == (
        "no rows in 'my.csv'; tokenizer of mine/tokenizer.json; "
        "config 'tiny/config.json' and 'sst2/train.csv'. wrote checkpoints/checkpoint-5; "
        "read org/bert-x/vocab.txt; raised at hub.py:470; "
        "see https://huggingface.co/docs/hub/a and /v1/jobs/7/logs; 3/4 and/or; "
        "no jobs/7/model.safetensors, nor files/ab; "
        'reset at "the file store"'
    )
