"""No answer to a non-admin key holds a store URI, a bucket, a worker's path or a traceback; an
admin key still reads them (issue 35, item 2).

After a real worker has run a sweep's job (checkpoints, metrics, a GLUE file), a job on an uploaded
file and a job that fails in the worker (a model whose config does not parse), with the store on
moto's S3 endpoint or the local folder, every GET route of the app's OpenAPI is asked with the
user's key (its path parameters filled with the jobs, their artifacts, the file, the sweep, the
webhook …), and so are the job's live stream with its log and the webhook deliveries' bodies; with
the S3 store, the walk is repeated while the store is down. None of them may name the places.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import tarfile
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from service.main import create_app
from shared import jobs_repo
from shared.core.config import Settings
from shared.core.db import Database
from shared.core.storage import open_store
from tests.support.dbutil import claimed
from tests.support.e2e import LOOPBACK_URL, live_api, run_worker_until_idle, wait_for
from tests.support.kit import ALICE, QUICK_JOB, ROOT, TINY_MODEL, auth
from tests.support.s3_endpoint import S3Endpoint
from tests.support.webhook_receiver import Receiver, receiver

TRAIN = b"sentence,label\n" + b"".join(f"a fine sentence number {i},{i % 2}\n".encode() for i in range(32))
PREFIX = "gj-private-prefix"  # the store's folder in its bucket: no sentence of ours holds it by chance
FAST_HOOKS = {"webhook_backoff_s": 0.05, "webhook_backoff_max_s": 0.2, "webhook_poll_s": 0.1}
EVENTS = ["job.succeeded", "job.failed", "checkpoint.declared", "sweep.finished"]


@pytest.fixture
def broken_models(tmp_path: Path, models_dir: Path) -> Path:
    """A models folder of this test's own: the tiny model, and one whose config does not parse."""
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copytree(models_dir / TINY_MODEL, folder / TINY_MODEL)  # a link would leave the folder
    broken = folder / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "bert", "hidden_size": "not a number"')
    return folder


# Each store once and each database once: what a user reads is written by the API's views, the same on
# both databases, while the store decides what the places are (a bucket and an outage, or folders).
# SQLite with S3 was a third run (143 s in CI, 45 CPU-s) that added neither a place nor a query.
@pytest.mark.e2e
@pytest.mark.parametrize(("db_url", "store"), [("sqlite", "local"), ("postgres", "s3")], indirect=["db_url"])
def test_no_answer_to_a_user_key_names_a_place(
    request: pytest.FixtureRequest,
    settings_factory: Any,
    db_url: str,
    store: str,
    broken_models: Path,
    models_dir: Path,
    glue_data: Path,
    tmp_path: Path,
) -> None:
    endpoint: S3Endpoint | None = None
    storage: dict[str, Any] = {}
    if store == "s3":
        s3_url: str = request.getfixturevalue("s3_url")
        endpoint = request.getfixturevalue("s3_endpoint")
        storage = {"storage_url": f"{s3_url.rsplit('/', 1)[0]}/{PREFIX}", "storage_retry_s": 1.0}
    settings: Settings = settings_factory(
        db_url,
        models_dir=broken_models,
        api_keys=[ALICE],
        admin_keys=[ROOT],
        webhook_allowed_hosts=["127.0.0.1"],
        **FAST_HOOKS,
        **storage,
    )
    if endpoint is not None:
        open_store(settings).check()  # makes the test's bucket
    places = [
        "s3://",
        PREFIX,
        str(tmp_path),  # the artifacts, cache and data folders are under it
        str(settings.artifacts_dir),
        str(settings.cache_dir),
        str(broken_models),
        str(models_dir),
        str(glue_data),
        "/site-packages/",
        "Traceback",
    ]
    if endpoint is not None:
        assert settings.storage_url is not None
        places += [settings.storage_url.removeprefix("s3://").split("/")[0], endpoint.url]

    with receiver() as hook, live_api(settings) as api:
        user, admin = auth(ALICE), auth(ROOT)
        webhook = _post(api, "/v1/webhooks", user, json={"url": f"{hook.url}/hook", "event_types": EVENTS})
        upload = api.post("/v1/files", files={"file": ("mine.csv", TRAIN)}, headers=user)
        assert upload.status_code == 201, upload.text
        file_id = upload.json()["id"]
        checkpointed = {**QUICK_JOB, "save_strategy": "steps", "save_steps": 1, "eval_strategy": "epoch"}
        sweep = _post(api, "/v1/sweeps", user, json={"spec": checkpointed, "seeds": [3]})
        uploaded = _post(
            api, "/v1/jobs", user, json={"spec": {**QUICK_JOB, "task_name": None, "train_file": file_id}}
        )
        broken = {**QUICK_JOB, "model_name_or_path": "broken-model"}
        failed = _post(api, "/v1/jobs", user, json={"spec": broken, "max_attempts": 1})
        run_worker_until_idle(settings, tmp_path / "worker.log")

        job_ids = [sweep["job_ids"][0], uploaded["id"], failed["id"]]
        jobs = {i: _get(api, f"/v1/jobs/{i}", admin).json() for i in job_ids}
        assert [jobs[i]["status"] for i in job_ids] == ["succeeded", "succeeded", "failed"], [
            (jobs[i]["status"], jobs[i]["error"]) for i in job_ids
        ]
        wait_for(lambda: len(hook.requests) >= 5, timeout_s=60)  # 3 jobs, 2 checkpoints (and the sweep)

        values = _parameters(
            api, admin, job_ids, file_id=file_id, sweep_id=sweep["id"], webhook_id=webhook["id"]
        )
        schema = create_app(settings).openapi()
        answers = _walk(api, schema, user, values)
        answers.update(_streams(api, user, job_ids))
        answers["webhook deliveries"] = "\n".join(r.body.decode() for r in hook.requests)
        admin_reads = _admin_reads(api, admin, job_ids)

        outage: dict[str, str] = {}
        if endpoint is not None:
            endpoint.down()
            try:
                outage = _walk(api, schema, user, values, outage=True)
            finally:
                endpoint.up()

    leaks = {
        (where, place) for where, text in {**answers, **outage}.items() for place in places if place in text
    }
    assert not leaks, sorted(leaks)
    if endpoint is not None:  # the outage was seen: the routes that read the store answered 503
        assert any(where.startswith("503 ") for where in outage), sorted(outage)
    _check_user_reads(answers, jobs, job_ids, hook)
    _check_admin_reads(admin_reads, settings, job_ids, store)


# ---------------------------------------------------------------------------------------------------


def _post(api: httpx.Client, path: str, headers: dict[str, str], **kwargs: Any) -> dict[str, Any]:
    answer = api.post(path, headers=headers, **kwargs)
    assert answer.status_code == 201, answer.text
    body: dict[str, Any] = answer.json()
    return body


def _get(api: httpx.Client, path: str, headers: dict[str, str], **params: Any) -> httpx.Response:
    answer = api.get(path, headers=headers, params=params)
    assert answer.status_code == 200, (path, answer.text[:500])
    return answer


def _parameters(
    api: httpx.Client, admin: dict[str, str], job_ids: list[int], **ids: Any
) -> dict[str, list[str]]:
    """Values for every path parameter of the API: the jobs, each of their artifacts (every file, and
    the folders a user downloads: checkpoints, logs, the whole job), the file, sweep and webhook."""
    artifacts = []
    for job_id in job_ids:
        listed = [a["path"] for a in _get(api, f"/v1/jobs/{job_id}/artifacts", admin).json()["data"]]
        folders = {p.rsplit("/", 1)[0] for p in listed if "/" in p}
        artifacts += [f"{job_id}|{p}" for p in sorted({*listed, *folders})]
    return {
        "job_id": [str(i) for i in job_ids],
        "path": artifacts,
        "file_id": [str(ids["file_id"])],
        "sweep_id": [str(ids["sweep_id"])],
        "search_id": ["1"],  # none: the answer is a 404, read like any other
        "name": ["tiny"],
        "webhook_id": [str(ids["webhook_id"])],
    }


def _walk(
    api: httpx.Client,
    api_schema: dict[str, Any],
    headers: dict[str, str],
    values: dict[str, list[str]],
    *,
    outage: bool = False,
) -> dict[str, str]:
    """Every GET route of the OpenAPI with every value of its path parameters: {url: the answer}."""
    schema = api_schema
    answers: dict[str, str] = {}
    for template, operations in schema["paths"].items():
        if "get" not in operations or template.endswith("/stream"):  # streams: _streams
            continue
        for url in _urls(template, values):
            answer = api.get(url, headers=headers)
            assert answer.status_code < 500 or (outage and answer.status_code == 503), (
                url,
                answer.text[:300],
            )
            answers[f"{answer.status_code} {url}"] = answer.content.decode("utf-8", errors="replace")
            answers[f"{answer.status_code} {url} headers"] = json.dumps(dict(answer.headers))
    walked = {re.sub(r"\{\w+\}", "{}", u.split(" ", 1)[1]) for u in answers}
    assert len(walked) >= 20, walked
    return answers


def _urls(template: str, values: dict[str, list[str]]) -> list[str]:
    names = re.findall(r"\{(\w+)\}", template)
    if not names:
        return [template]
    if "path" in names:  # an artifact: its job and its path go together
        pairs = [v.split("|", 1) for v in values["path"]]
        return [template.replace("{job_id}", j).replace("{path}", p) for j, p in pairs]
    [name] = names
    return [template.replace(f"{{{name}}}", value) for value in values[name]]


def _streams(api: httpx.Client, headers: dict[str, str], job_ids: list[int]) -> dict[str, str]:
    """Each (ended) job's live stream with its log, read to its `end` event; its log by attempt."""
    answers = {}
    for job_id in job_ids:
        url = f"/v1/jobs/{job_id}/stream"
        with api.stream("GET", url, params={"logs": "true"}, headers=headers, timeout=60) as answer:
            assert answer.status_code == 200, answer.read()
            text = "".join(answer.iter_text())
        assert "event: end" in text and "event: log" in text, text[-2000:]
        answers[url] = text
        answers[f"/v1/jobs/{job_id}/logs?attempt=1"] = _get(
            api, f"/v1/jobs/{job_id}/logs", headers, attempt=1
        ).text
    return answers


def _admin_reads(api: httpx.Client, admin: dict[str, str], job_ids: list[int]) -> dict[str, Any]:
    [done, _, failed] = job_ids
    return {
        "job": _get(api, f"/v1/jobs/{done}", admin).json(),
        "checkpoints": _get(api, f"/v1/jobs/{done}/checkpoints", admin).json()["data"],
        "failed log": _get(api, f"/v1/jobs/{failed}/logs", admin).text,
    }


def _check_user_reads(
    answers: dict[str, str], jobs: dict[int, Any], job_ids: list[int], hook: Receiver
) -> None:
    """What the user reads instead: the API paths and the download commands."""
    done, uploaded, failed = job_ids
    view = json.loads(answers[f"200 /v1/jobs/{done}"])
    assert view["output_dir"] == f"/v1/jobs/{done}/artifacts", view["output_dir"]
    assert view["result"]["model_dir"] == f"/v1/jobs/{done}/artifacts", view["result"]
    data_files = {f["role"]: f for f in view["environment"]["data_files"]}
    assert data_files["train"]["path"] == "SST-2/train.tsv", data_files  # its path in the GLUE folder
    assert (
        data_files["train"]["sha256"]
        == {f["role"]: f for f in jobs[done]["environment"]["data_files"]}["train"]["sha256"]
    )
    mine = json.loads(answers[f"200 /v1/jobs/{uploaded}"])["environment"]["data_files"]
    assert [f["path"] for f in mine if f["role"] == "train_file"] == ["mine.csv"], mine  # the upload's name
    checkpoints = json.loads(answers[f"200 /v1/jobs/{done}/checkpoints"])["data"]
    assert [c["path"] for c in checkpoints] == [
        f"/v1/jobs/{done}/artifacts/checkpoints/checkpoint-{c['step']}" for c in checkpoints
    ] and checkpoints, checkpoints
    assert all(c["download"] == f"gluejobs download {done} DIR --checkpoint {c['step']}" for c in checkpoints)
    # The paths answer: a checkpoint's folder as a tar, the job's listing.
    assert any(
        k.startswith("200 ")
        and k.endswith(f"/v1/jobs/{done}/artifacts/checkpoints/checkpoint-{checkpoints[0]['step']}")
        for k in answers
    )
    # The failure's log still says why, in its last line, without the frames.
    log = answers[f"/v1/jobs/{failed}/logs?attempt=1"]
    assert "broken-model/config.json" in log and "is not a valid JSON file" in log, log[-2000:]
    bodies = [json.loads(r.body) for r in hook.requests]
    assert {b["type"] for b in bodies} >= {"job.succeeded", "job.failed", "checkpoint.declared"}, bodies


def _check_admin_reads(reads: dict[str, Any], settings: Settings, job_ids: list[int], store: str) -> None:
    """The operator's key still reads where things are."""
    done = job_ids[0]
    job, checkpoints = reads["job"], reads["checkpoints"]
    where = f"{settings.storage_url}/jobs/{done}" if store == "s3" else str(settings.job_dir(done))
    assert job["output_dir"] == where, job["output_dir"]
    assert job["result"]["model_dir"].startswith("/") and job["result"]["model_dir"].endswith(f"/{done}")
    paths = [f["path"] for f in job["environment"]["data_files"] if "path" in f]
    assert paths and all(p.startswith("/") for p in paths), paths
    assert checkpoints and all(c["path"].startswith(where) for c in checkpoints), checkpoints
    assert (
        "Traceback (most recent call last):" in reads["failed log"]
        and "/site-packages/" in reads["failed log"]
    )


# --- without a worker: a job's row and log written as a worker writes them ----------------------------


def test_a_user_reads_api_paths_where_an_admin_reads_the_workers_places(
    settings_factory: Any, db_url: str, tmp_path: Path
) -> None:
    settings: Settings = settings_factory(db_url, api_keys=[ALICE], admin_keys=[ROOT])
    store_uri = "s3://team-store/gj/jobs/1"
    worker_dir = "/srv/worker-7/artifacts/jobs/1"
    site = "/opt/venv/lib/python3.12/site-packages"
    environment = {
        "data_files": [
            {"role": "train", "path": f"{settings.glue_dir}/SST-2/train.tsv", "sha256": "a" * 64},
            {"role": "validation", "path": "/srv/worker-7/cache/files/ab/" + "b" * 64 + ".csv"},
        ],
        "model_files": [{"role": "config.json", "path": f"{settings.models_dir}/{TINY_MODEL}/config.json"}],
        "error": f"OSError: [Errno 2] No such file or directory: '{site}/torch/lib/x.so'",
    }
    log = (
        "step 1 loss 0.69\nTraceback (most recent call last):\n"
        f'  File "{site}/worker/child.py", line 140, in run\n    train()\n'
        f"OSError: cannot read {worker_dir}/checkpoints/checkpoint-4/model.safetensors\n"
    )
    app = create_app(settings)
    with TestClient(app, base_url=LOOPBACK_URL) as client:
        job = client.post("/v1/jobs", json={"spec": QUICK_JOB}, headers=auth(ALICE))
        assert job.status_code == 201, job.text
        job_id = job.json()["id"]
        with Database(db_url).session() as session:
            claim = claimed(session, job_id)
            jobs_repo.set_output_dir(session, claim=claim, output_dir=store_uri)
            jobs_repo.set_environment(session, job_id=job_id, environment=environment, claim=claim)
            jobs_repo.add_checkpoint(
                session,
                job_id=job_id,
                step=4,
                epoch=1.0,
                path=f"{store_uri}/checkpoints/checkpoint-4",
                metrics={},
                claim=claim,
            )
            jobs_repo.set_result(
                session, job_id=job_id, result={"model_dir": worker_dir, "steps": 4}, claim=claim
            )
        logs = settings.job_dir(job_id) / "logs"
        logs.mkdir(parents=True)
        (logs / "attempt-1.log").write_text(log)

        def read(key: str) -> dict[str, Any]:
            paths = ["", "/checkpoints", "/logs", "/artifacts/logs/attempt-1.log", "/artifacts/logs"]
            read = {p: client.get(f"/v1/jobs/{job_id}{p}", headers=auth(key)) for p in paths}
            read["list"] = client.get("/v1/jobs", headers=auth(key))
            assert all(r.status_code == 200 for r in read.values()), {p: r.text for p, r in read.items()}
            return read

        user, admin = read(ALICE), read(ROOT)

    for where, answer in user.items():
        for place in ("s3://", "team-store", "/srv/", site, "site-packages", "Traceback", str(tmp_path)):
            assert place not in answer.text, (where, place, answer.text)
    view = user[""].json()
    assert view["output_dir"] == f"/v1/jobs/{job_id}/artifacts"
    assert view["result"] == {"model_dir": f"/v1/jobs/{job_id}/artifacts", "steps": 4}
    assert [f["path"] for f in view["environment"]["data_files"]] == ["SST-2/train.tsv", f"{'b' * 64}.csv"]
    assert view["environment"]["model_files"][0]["path"] == f"{TINY_MODEL}/config.json"
    assert view["environment"]["error"] == "OSError: [Errno 2] No such file or directory: 'x.so'"
    assert user["list"].json()["data"][0]["output_dir"] == view["output_dir"]
    [checkpoint] = user["/checkpoints"].json()["data"]
    assert checkpoint["path"] == f"/v1/jobs/{job_id}/artifacts/checkpoints/checkpoint-4"
    assert checkpoint["download"] == f"gluejobs download {job_id} DIR --checkpoint 4"
    # The log: the cause stays, a path of a folder the API does not know by its last part; the
    # offset still counts the file's bytes.
    kept = "step 1 loss 0.69\nOSError: cannot read model.safetensors\n"
    assert user["/logs"].text == kept and user["/artifacts/logs/attempt-1.log"].text == kept
    assert user["/logs"].headers["x-gluejobs-log-offset"] == str(len(log.encode()))
    with tarfile.open(fileobj=io.BytesIO(user["/artifacts/logs"].content)) as tar:
        [member] = tar.getmembers()
        assert tar.extractfile(member).read().decode() == kept  # type: ignore[union-attr]

    # The operator's key reads them all as written.
    shown = admin[""].json()
    assert shown["output_dir"] == store_uri and shown["result"]["model_dir"] == worker_dir
    assert shown["environment"] == environment
    assert admin["/checkpoints"].json()["data"][0]["path"] == f"{store_uri}/checkpoints/checkpoint-4"
    assert admin["/logs"].text == log and admin["/artifacts/logs/attempt-1.log"].text == log
