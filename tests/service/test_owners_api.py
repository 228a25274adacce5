"""/v1/owners, priorities and the queued quota through real HTTP, on SQLite and Postgres: who sees
and sets what, the audit entry, 422 and 429 storing nothing, and `waiting_for` on job views."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gluejobs import ApiError, AsyncClient, Client
from gluejobs.cli import main as cli
from service.accounts import audit
from shared import jobs_repo
from shared.core.config import Settings
from shared.core.db import Database
from shared.core.tables import Job, Sweep
from tests.support.dbutil import count_rows
from tests.support.e2e import live_api
from tests.support.kit import SPEC, auth

ALICE = "alice=alice-key-0123456789abcdef"
BOB = "bob=bob-key-0123456789abcdef"
ROOT = "root=root-key-0123456789abcdef"


@pytest.fixture
def keyed(settings_factory, db_url: str) -> Settings:  # type: ignore[no-untyped-def]
    settings: Settings = settings_factory(
        db_url, api_keys=[ALICE, BOB], admin_keys=[ROOT], default_max_queued=3, max_user_priority=100
    )
    return settings


@pytest.fixture
def api(keyed: Settings) -> Iterator[httpx.Client]:
    with live_api(keyed) as client:
        yield client


def _submit(api: httpx.Client, key: str, **body: object) -> httpx.Response:
    return api.post("/v1/jobs", json={"spec": SPEC, **body}, headers=auth(key))


def test_owners_list_and_quota_changes(api: httpx.Client, keyed: Settings) -> None:
    assert _submit(api, ALICE).status_code == 201
    everyone = api.get("/v1/owners", headers=auth(ROOT)).json()["data"]
    alice = next(o for o in everyone if o["name"] == "alice")
    assert {o["name"] for o in everyone} >= {"alice", "bob", "root"}
    assert alice["queued_jobs"] == 1 and alice["devices_in_use"] == 0 and alice["share"] == 1
    assert alice["quota"] == {
        "max_devices": None,
        "max_queued": 3,
        "max_device_hours_per_day": None,
        "max_storage_bytes": None,
    }
    assert alice["quota_source"]["max_queued"] == "default"
    own = api.get("/v1/owners", headers=auth(BOB)).json()["data"]
    assert [o["name"] for o in own] == ["bob"]

    refused = api.patch("/v1/owners/alice", json={"max_devices": 1}, headers=auth(BOB))
    assert refused.status_code == 403, refused.text
    changed = api.patch("/v1/owners/alice", json={"max_devices": 1, "share": 2}, headers=auth(ROOT))
    assert changed.status_code == 200, changed.text
    view = changed.json()
    assert (view["share"], view["quota"]["max_devices"], view["quota_source"]["max_devices"]) == (
        2,
        1,
        "owner",
    )
    back = api.patch("/v1/owners/alice", json={"max_devices": None}, headers=auth(ROOT)).json()
    assert (back["share"], back["quota"]["max_devices"], back["quota_source"]["max_devices"]) == (
        2,
        None,
        "default",
    )
    bad = api.patch("/v1/owners/alice", json={"share": 0}, headers=auth(ROOT))
    assert bad.status_code == 422 and "share" in bad.text
    for field in ("max_queued", "share"):  # a boolean is not a limit of 1 (pydantic's lax mode)
        boolean = api.patch("/v1/owners/alice", json={field: True}, headers=auth(ROOT))
        assert boolean.status_code == 422 and field in boolean.text
    db = Database(keyed.database_url)
    with db.session() as session:
        entries, _ = audit.list_entries(session, after=None, limit=10)
    db.dispose()
    assert [(e.action, e.target, e.actor) for e in entries] == [("quota.set", "owner alice", "root")] * 2
    assert entries[-1].data == {
        "before": {"max_devices": None, "share": 1.0},
        "after": {"max_devices": 1, "share": 2.0},
    }


def test_priority_above_the_users_range_needs_an_admin(api: httpx.Client, keyed: Settings) -> None:
    refused = _submit(api, ALICE, priority=101)
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["field"] == "priority" and "100" in error["message"]
    sweep = api.post("/v1/sweeps", json={"spec": SPEC, "seeds": [1, 2], "priority": 500}, headers=auth(ALICE))
    assert sweep.status_code == 422 and sweep.json()["error"]["field"] == "priority"
    db = Database(keyed.database_url)
    assert (count_rows(db, Job), count_rows(db, Sweep)) == (0, 0)
    admin = _submit(api, ROOT, priority=500)
    assert admin.status_code == 201 and admin.json()["priority"] == 500
    assert _submit(api, ALICE, priority=100).status_code == 201
    db.dispose()


def test_over_the_queued_quota_is_429_and_stores_nothing(api: httpx.Client, keyed: Settings) -> None:
    db = Database(keyed.database_url)
    for _ in range(2):
        assert _submit(api, ALICE).status_code == 201
    sweep = api.post("/v1/sweeps", json={"spec": SPEC, "seeds": [1, 2]}, headers=auth(ALICE))
    assert sweep.status_code == 429, sweep.text
    assert sweep.json()["error"]["code"] == "over_quota" and "max_queued is 3" in sweep.text
    assert (count_rows(db, Job), count_rows(db, Sweep)) == (2, 0)
    first = _submit(api, ALICE).json()
    over = _submit(api, ALICE)
    assert over.status_code == 429 and "max_queued is 3" in over.json()["error"]["message"]
    assert over.headers.get("retry-after")
    rerun = api.post(f"/v1/jobs/{first['id']}/rerun", headers=auth(ALICE))
    assert rerun.status_code == 429, rerun.text
    assert count_rows(db, Job) == 3
    assert _submit(api, BOB).status_code == 201  # bob's own quota
    # The client does not wait on Retry-After for a quota (waiting would not change it): it fails
    # at once, where it would otherwise try four times more, up to 30 s apart.
    started = time.monotonic()
    with (
        Client(str(api.base_url), api_key=ALICE.split("=", 1)[1]) as client,
        pytest.raises(ApiError) as error,
    ):
        client.jobs.create(SPEC)
    assert (error.value.status_code, error.value.code) == (429, "over_quota")
    assert time.monotonic() - started < 20
    assert count_rows(db, Job) == 4
    db.dispose()


def test_waiting_for_names_the_quota_on_one_job_and_in_lists(api: httpx.Client, keyed: Settings) -> None:
    api.patch("/v1/owners/alice", json={"max_devices": 1}, headers=auth(ROOT))
    ids = [_submit(api, ALICE).json()["id"] for _ in range(2)]
    db = Database(keyed.database_url)
    with db.session() as session:
        jobs_repo.register_worker(session, worker_id="w1", host="h", pid=1, devices=["cpu0", "cpu1"])
        claimed = jobs_repo.claim_next(session, worker_id="w1", lease_s=60)
    db.dispose()
    assert claimed is not None and claimed.id == ids[0]
    waiting = api.get(f"/v1/jobs/{ids[1]}", headers=auth(ALICE)).json()["waiting_for"]
    assert waiting == {"reason": "quota", "message": "alice holds 1 of 1 devices (max_devices)"}
    listed = {j["id"]: j["waiting_for"] for j in api.get("/v1/jobs", headers=auth(ALICE)).json()["data"]}
    assert listed == {ids[0]: None, ids[1]: waiting}
    wide = api.post("/v1/jobs", json={"spec": {**SPEC, "num_processes": 4}}, headers=auth(BOB)).json()
    assert wide["waiting_for"] == {"reason": "devices", "message": "needs 4 devices; no worker has that many"}


def test_client_and_cli_list_and_set_owners(
    settings_factory: Any, sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings: Settings = settings_factory(sqlite_url, api_keys=[ALICE], admin_keys=[ROOT])
    with live_api(settings) as api:
        url = str(api.base_url)
        root_key, alice_key = ROOT.split("=", 1)[1], ALICE.split("=", 1)[1]
        with Client(url, api_key=root_key) as client:
            owner = client.owners.update("alice", max_devices=2, share=3)
            assert (owner.name, owner.share, owner.quota["max_devices"]) == ("alice", 3, 2)
            assert {o.name for o in client.owners.list()} >= {"alice", "root"}
            with pytest.raises(TypeError, match="max_gpus"):
                client.owners.update("alice", max_gpus=1)

        async def alice_sees() -> list[str]:
            async with AsyncClient(url, api_key=alice_key) as client:
                return [o.name for o in await client.owners.list()]

        assert asyncio.run(alice_sees()) == ["alice"]
        capsys.readouterr()
        assert (
            cli(
                [
                    "owners",
                    "set",
                    "alice",
                    "--max-devices",
                    "default",
                    "--max-queued",
                    "7",
                    "--url",
                    url,
                    "--api-key",
                    root_key,
                ]
            )
            == 0
        )
        line = capsys.readouterr().out
        assert "alice  share 3" in line and "max_devices no limit" in line and "max_queued 7" in line
        assert cli(["owners", "ls", "--json", "--url", url, "--api-key", alice_key]) == 0
        listed = json.loads(capsys.readouterr().out)
        assert [(o["name"], o["quota"]["max_queued"], o["quota_source"]["max_queued"]) for o in listed] == [
            ("alice", 7, "owner")
        ]
        assert cli(["owners", "set", "alice", "--share", "2", "--url", url, "--api-key", alice_key]) == 2
        assert "admin" in capsys.readouterr().err
        api.patch("/v1/owners/alice", json={"max_devices": 0}, headers=auth(ROOT))
        job_id = _submit(api, ALICE).json()["id"]
        assert cli(["show", str(job_id), "--url", url, "--api-key", alice_key]) == 0
        assert "waiting for  quota: alice holds 0 of 0 devices (max_devices)" in capsys.readouterr().out
        assert cli(["ls", "--url", url, "--api-key", alice_key]) == 0
        row = next(line for line in capsys.readouterr().out.splitlines() if line.split()[0] == str(job_id))
        assert row.split()[1:3] == ["queued", "(quota)"], row
