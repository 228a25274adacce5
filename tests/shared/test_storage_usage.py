"""What an owner holds in the store and how it is bounded (issue 33 item 5), on SQLite and Postgres with
real rows and the real store (the local folder; S3 through moto): the sweep's sizes on GET /v1/owners,
DELETE /v1/jobs/{id}/checkpoints (owned, 409 while the job runs, `keep`, rows and folders both gone,
a removal cut short finished by the sweep), the retention, and the storage quota (an upload refused
with 429 naming it, a queued job held with `waiting_for` storage and not claimed)."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update

from gluejobs import ApiError, AsyncClient, Client
from gluejobs.cli import main as cli
from service.main import create_app
from shared import jobs_repo
from shared.core.config import Settings
from shared.core.db import Database
from shared.core.storage import Store, open_store
from shared.core.tables import Job, JobStatus, StoreDeletion, utcnow
from shared.jobs_repo.storage_usage import remove_checkpoints, sweep_storage
from shared.scheduling import quotas
from shared.wire.job_folder import job_key
from tests.support.dbutil import claimed
from tests.support.e2e import LOOPBACK_URL, live_api
from tests.support.kit import ALICE, BOB, ROOT, SPEC, TINY_MODEL, auth

TRAIN = b"sentence,label\n" + b"".join(f"a fine sentence number {i},{i % 2}\n".encode() for i in range(40))
STEPS = (10, 20, 30)  # 20 is the best
LATER = timedelta(minutes=5)  # the sweep sizes a finished job once it has settled


def _put(store: Store, key: str, size: int) -> None:
    """`size` bytes at `key`, as a worker's upload leaves them."""
    local = Path(store.local_root or "/nonexistent")
    if store.is_local:
        path = local / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)
    else:
        store.fs.pipe_file(store.path(key), b"x" * size)


def _trained_job(db: Database, store: Store, owner: str, *, status: JobStatus = JobStatus.succeeded) -> int:
    """A job of `owner` as a worker leaves it: three declared checkpoints (1000, 2000, 3000 bytes, the
    second the best) and a final model and log (500 bytes), finished."""
    with db.session() as session:
        job_id = jobs_repo.create_job(session, spec=SPEC, owner=owner).id
        claim = claimed(session, job_id)
        for step in STEPS:
            for name, size in (("model.safetensors", step * 90), ("gluejobs_state.json", step * 10)):
                _put(store, job_key(job_id, f"checkpoints/checkpoint-{step}/{name}"), size)
            jobs_repo.add_checkpoint(
                session,
                job_id=job_id,
                step=step,
                epoch=step / 10,
                path=store.location(job_key(job_id, f"checkpoints/checkpoint-{step}")),
                metrics={"accuracy": 0.5},
                is_best=step == 20,
                claim=claim,
            )
        _put(store, job_key(job_id, "model.safetensors"), 400)
        _put(store, job_key(job_id, "logs/attempt-1.log"), 100)
        jobs_repo.finish_job(session, claim=claim, status=status)
    return job_id


def _storage(client: TestClient, key: str) -> dict[str, Any]:
    owners = client.get("/v1/owners", headers=auth(key)).json()["data"]
    return {o["name"]: o for o in owners}


def _sweep(db: Database, store: Store, **kwargs: Any) -> dict[str, int]:
    with db.session() as session:
        return sweep_storage(session, store, retention_days=kwargs.get("days"), now=utcnow() + LATER)


def _journal(db: Database) -> int:
    with db.session() as session, session.begin():
        return int(session.scalar(select(func.count()).select_from(StoreDeletion)) or 0)


def _folders(store: Store, job_id: int) -> list[str]:
    return sorted({f.path.split("/")[0] for f in store.list(job_key(job_id, "checkpoints"))})


def test_owners_storage_checkpoint_removal_and_the_quota(settings_factory, db_url: str) -> None:  # type: ignore[no-untyped-def]
    settings: Settings = settings_factory(
        db_url, api_keys=[f"alice={ALICE}", f"bob={BOB}"], admin_keys=[f"root={ROOT}"]
    )
    db, store = Database(db_url), open_store(settings)
    client = TestClient(create_app(settings), base_url=LOOPBACK_URL)

    done = _trained_job(db, store, "alice")
    failed = _trained_job(db, store, "alice", status=JobStatus.failed)
    assert _storage(client, ALICE)["alice"]["storage"]["total_bytes"] == 0  # not sized yet
    assert _sweep(db, store)["sized"] == 8  # three checkpoints and the job's other files, twice
    alice = _storage(client, ALICE)["alice"]
    assert alice["storage"] == {
        "files_bytes": 0,
        "models_bytes": 0,
        "checkpoints_bytes": 12000,
        "outputs_bytes": 1000,
        "total_bytes": 13000,
    }
    assert (
        alice["quota"]["max_storage_bytes"] is None
        and alice["quota_source"]["max_storage_bytes"] == "default"
    )
    assert set(_storage(client, BOB)) == {"bob"}  # another owner's storage is not shown
    assert _sweep(db, store)["sized"] == 0  # each is sized once

    # Removal: owned, refused while the job runs, `keep` checked, rows and folders both gone.
    assert client.delete(f"/v1/jobs/{done}/checkpoints", headers=auth(BOB)).status_code == 404
    with db.session() as session:
        running = jobs_repo.create_job(session, spec=SPEC, owner="alice").id
    refused = client.delete(f"/v1/jobs/{running}/checkpoints", headers=auth(ALICE))
    assert refused.status_code == 409 and "queued" in refused.json()["error"]["message"]
    unknown = client.delete(f"/v1/jobs/{done}/checkpoints?keep=checkpoint-99", headers=auth(ALICE))
    assert unknown.status_code == 422 and unknown.json()["error"]["field"] == "keep"
    assert "checkpoint-99" in unknown.json()["error"]["message"]
    garbled = client.delete(f"/v1/jobs/{done}/checkpoints?keep=best", headers=auth(ALICE))
    assert garbled.status_code == 422 and garbled.json()["error"]["field"] == "keep"
    assert _folders(store, done) == ["checkpoint-10", "checkpoint-20", "checkpoint-30"]

    removed = client.delete(f"/v1/jobs/{done}/checkpoints", headers=auth(ALICE))
    assert removed.status_code == 200, removed.text
    assert removed.json() == {
        "job_id": done,
        "removed": ["checkpoint-10", "checkpoint-30"],
        "kept": ["checkpoint-20"],  # the best; the final model is the job's own folder
        "freed_bytes": 4000,
    }
    assert _folders(store, done) == ["checkpoint-20"]
    assert store.exists(job_key(done, "model.safetensors"))
    listed = client.get(f"/v1/jobs/{done}/checkpoints", headers=auth(ALICE)).json()
    rows = listed["data"] if isinstance(listed, dict) else listed
    assert [row["step"] for row in rows] == [20]
    assert "store" not in removed.text and str(settings.artifacts_dir) not in removed.text
    assert _storage(client, ALICE)["alice"]["storage"]["checkpoints_bytes"] == 8000
    events = client.get(f"/v1/jobs/{done}/events", headers=auth(ALICE)).json()["data"]
    assert any("removed checkpoint(s) at step 10, 30" in e["message"] for e in events)

    # A removal cut short after its rows went (a crash before the folders): the sweep finishes it.
    with db.session() as session:
        pruned = remove_checkpoints(session, job_id=failed, owner="alice", keep=None, actor="test")
    assert (pruned.removed, pruned.kept) == (["checkpoint-10"], ["checkpoint-20", "checkpoint-30"])
    assert _folders(store, failed) == ["checkpoint-10", "checkpoint-20", "checkpoint-30"]  # not yet
    assert _journal(db) == 1
    with db.session() as session:
        assert len(jobs_repo.list_checkpoints(session, job_id=failed)) == 2
    assert _sweep(db, store)["finished"] == 1
    assert _folders(store, failed) == ["checkpoint-20", "checkpoint-30"]
    assert _journal(db) == 0
    kept = client.delete(f"/v1/jobs/{failed}/checkpoints?keep=checkpoint-30", headers=auth(ROOT))
    assert kept.json()["removed"] == ["checkpoint-20"] and _folders(store, failed) == ["checkpoint-30"]

    # The quota: an admin sets alice's at what she holds. Her upload is refused, naming it; her
    # queued job waits (storage) and is not claimed, while bob's is; room again, it starts.
    total = _storage(client, ALICE)["alice"]["storage"]["total_bytes"]
    set_quota = client.patch("/v1/owners/alice", json={"max_storage_bytes": total}, headers=auth(ROOT))
    assert set_quota.status_code == 200 and set_quota.json()["quota_source"]["max_storage_bytes"] == "owner"
    assert (
        client.patch("/v1/owners/alice", json={"max_storage_bytes": -1}, headers=auth(ROOT)).status_code
        == 422
    )
    upload = client.post("/v1/files", files={"file": ("t.csv", TRAIN)}, headers=auth(ALICE))
    assert upload.status_code == 429, upload.text
    error = upload.json()["error"]
    assert error["code"] == "over_quota" and "max_storage_bytes" in error["message"]
    assert f"({total} bytes)" in error["message"]
    waiting = client.get(f"/v1/jobs/{running}", headers=auth(ALICE)).json()["waiting_for"]
    assert waiting["reason"] == "storage" and "max_storage_bytes" in waiting["message"], waiting
    quotas._over_storage.clear()  # the claim's answer is reused for 5 s (OVER_STORAGE_CACHE_S)
    with db.session() as session:
        bobs = jobs_repo.create_job(session, spec=SPEC, owner="bob").id
        assert jobs_repo.claim_next(session, worker_id="w2", lease_s=60).id == bobs
        assert jobs_repo.claim_next(session, worker_id="w2", lease_s=60) is None
    assert client.post("/v1/files", files={"file": ("t.csv", TRAIN)}, headers=auth(BOB)).status_code == 201
    client.patch("/v1/owners/alice", json={"max_storage_bytes": total + len(TRAIN)}, headers=auth(ROOT))
    assert client.post("/v1/files", files={"file": ("t.csv", TRAIN)}, headers=auth(ALICE)).status_code == 201
    assert _storage(client, ROOT)["alice"]["storage"]["files_bytes"] == len(TRAIN)
    client.patch("/v1/owners/alice", json={"max_storage_bytes": None}, headers=auth(ROOT))
    quotas._over_storage.clear()
    with db.session() as session:
        assert jobs_repo.claim_next(session, worker_id="w3", lease_s=60).id == running

    # The retention's query on this database: only a job finished long enough ago, once.
    old = _trained_job(db, store, "bob")
    with db.session() as session, session.begin():
        session.execute(update(Job).where(Job.id == old).values(finished_at=utcnow() - timedelta(days=10)))
    assert _sweep(db, store, days=7)["retained"] == 1 and _sweep(db, store, days=7)["retained"] == 0
    assert _folders(store, old) == ["checkpoint-20"] and len(_folders(store, failed)) == 1
    db.dispose()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_retention_removes_old_jobs_checkpoints_in_the_s3_store(
    settings_factory, db_url: str, s3_url: str
) -> None:  # type: ignore[no-untyped-def]
    """GLUEJOBS_CHECKPOINT_RETENTION_DAYS through the sweep, on the S3 store: a job finished longer ago
    loses its checkpoints but the best (its rows and its objects, nothing left behind); a recent one
    keeps them all; no row names a missing object and no object lacks a row."""
    settings: Settings = settings_factory(db_url, storage_url=s3_url)
    db, store = Database(db_url), open_store(settings)
    store.check()
    old, recent = _trained_job(db, store, "alice"), _trained_job(db, store, "alice")
    with db.session() as session, session.begin():
        session.execute(update(Job).where(Job.id == old).values(finished_at=utcnow() - timedelta(days=10)))
    assert _sweep(db, store, days=7)["retained"] == 1
    assert _folders(store, old) == ["checkpoint-20"] and len(_folders(store, recent)) == 3
    with db.session() as session:
        for job_id in (old, recent):
            steps = {f"checkpoint-{row.step}" for row in jobs_repo.list_checkpoints(session, job_id=job_id)}
            assert steps == set(_folders(store, job_id))
    assert _journal(db) == 0
    assert _sweep(db, store, days=7)["retained"] == 0  # nothing more to remove: not asked again
    db.dispose()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_client_and_the_command_line(
    settings_factory, db_url: str, models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    """client.jobs.prune_checkpoints (sync and async), `gluejobs checkpoints ls|prune`, and the storage
    in `gluejobs owners ls` and `owners set --max-storage-bytes`, against a real server whose own
    storage sweep sizes the checkpoints (the jobs' other files wait until they have settled)."""
    settings: Settings = settings_factory(
        db_url, api_keys=[f"alice={ALICE}"], admin_keys=[f"root={ROOT}"], storage_sweep_s=0.2
    )
    db, store = Database(db_url), open_store(settings)
    jobs = [_trained_job(db, store, "alice") for _ in range(3)]
    with live_api(settings) as api:
        url = str(api.base_url)
        with Client(url, api_key=ALICE) as client:
            deadline = time.monotonic() + 20
            while client.owners.list()[0].storage.get("checkpoints_bytes") != 18000:
                assert time.monotonic() < deadline, client.owners.list()[0].storage
                time.sleep(0.1)
            assert client.owners.list()[0].storage["outputs_bytes"] == 0
            done = client.jobs.prune_checkpoints(jobs[0], keep=["checkpoint-10"])
            assert (done.removed, done.kept, done.freed_bytes) == (
                ["checkpoint-20", "checkpoint-30"],
                ["checkpoint-10"],
                5000,
            )
            assert client.owners.list()[0].storage["checkpoints_bytes"] == 13000

        async def prune() -> Any:
            async with AsyncClient(url, api_key=ALICE) as client:
                return await client.jobs.prune_checkpoints(jobs[1])

        assert asyncio.run(prune()).removed == ["checkpoint-10", "checkpoint-30"]
        capsys.readouterr()
        assert cli(["checkpoints", "ls", str(jobs[2]), "--url", url, "--api-key", ALICE]) == 0
        assert "checkpoint-20  epoch 2  best" in capsys.readouterr().out
        assert (
            cli(["checkpoints", "prune", str(jobs[2]), "--keep-none", "--url", url, "--api-key", ALICE]) == 0
        )
        line = capsys.readouterr().out
        assert line.startswith(
            f"job {jobs[2]}: removed checkpoint-10, checkpoint-20, checkpoint-30 (5.9 KiB)"
        ), line
        args = ["--url", url, "--api-key", ROOT]
        assert cli(["owners", "set", "alice", "--max-storage-bytes", "100000", *args]) == 0
        assert "stores 2.9 KiB (max_storage_bytes 97.7 KiB)" in capsys.readouterr().out
        with Client(url, api_key=ALICE) as client, pytest.raises(ApiError) as refused:
            client.models.upload(models_dir / TINY_MODEL, name="too-big")  # a model past the quota
        assert refused.value.status_code == 429 and "max_storage_bytes" in refused.value.message
        assert refused.value.code == "over_quota"
    db.dispose()
