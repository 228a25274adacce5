"""Keys managed over the API (issue 16): admins make, list, revoke and rotate keys; a rotated key's
owner keeps its jobs; a revocation holds on the next request on a second API process; an expired
key and a read-only key's changes are refused; secrets appear in no list, log line, event or audit
entry; each job's events name who created and cancelled it; data made under configured keys before
owners existed migrates and stays visible to its key. Real API processes, SQLite and Postgres."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import MetaData, Table, insert, make_url, select, text, update

from gluejobs.cli import main
from service.accounts import api_keys
from service.accounts.auth import KEY_CACHE_S
from shared.core.config import Settings
from shared.core.db import Database
from shared.core.migrate import upgrade
from shared.core.owners import unnamed_owner
from shared.core.tables import ApiKey, IdempotencyKey, Job, KeyRole, utcnow
from tests.support import kit
from tests.support.dbutil import count_rows
from tests.support.e2e import REPO, api_process, live_api, wait_for
from tests.support.kit import auth

ROOT = "root-admin-key-0123456789abcdef"
CAROL = "carol-user-key-0123456789abcdef"
SPEC = {**kit.SPEC, "max_train_samples": 16}


def answer(response: httpx.Response, status: int) -> Any:
    assert response.status_code == status, response.text
    return response.json()


def make_key(api: httpx.Client, owner: str, **body: Any) -> dict[str, Any]:
    made: dict[str, Any] = answer(
        api.post("/v1/keys", json={"owner": owner, **body}, headers=auth(ROOT)), 201
    )
    return made


def events_of(api: httpx.Client, job_id: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = answer(api.get(f"/v1/jobs/{job_id}/events", headers=auth(ROOT)), 200)["data"]
    return rows


@pytest.fixture
def keyed(settings_factory: Any, db_url: str) -> Settings:
    settings: Settings = settings_factory(db_url, admin_keys=[f"root={ROOT}"], api_keys=[f"carol={CAROL}"])
    return settings


@pytest.fixture
def two_apis(keyed: Settings, tmp_path: Path) -> Iterator[tuple[httpx.Client, httpx.Client, list[Path]]]:
    """Two API processes on one database, each logging to its own file."""
    logs = [tmp_path / "api-a.log", tmp_path / "api-b.log"]
    with api_process(keyed, log=logs[0]) as (first, _), api_process(keyed, log=logs[1]) as (second, _):
        yield first, second, logs


@pytest.mark.e2e
def test_create_use_rotate_revoke_across_two_api_processes(
    two_apis: tuple[httpx.Client, httpx.Client, list[Path]], db: Database
) -> None:
    api, other, logs = two_apis
    made = make_key(api, "bob", name="bob-laptop")
    assert (made["owner"], made["role"], made["name"]) == ("bob", "user", "bob-laptop")
    assert made["secret"].startswith(made["prefix"]) and made["created_by"] == "root"
    job = answer(api.post("/v1/jobs", json={"spec": SPEC}, headers=auth(made["secret"])), 201)
    queued = answer(api.post("/v1/jobs", json={"spec": SPEC}, headers=auth(made["secret"])), 201)

    rotated = answer(api.post(f"/v1/keys/{made['id']}/rotate", headers=auth(ROOT)), 201)
    assert (rotated["owner"], rotated["role"], rotated["name"]) == ("bob", "user", "bob-laptop")
    assert rotated["rotated_from"] == made["id"] and rotated["secret"] != made["secret"]
    # The new key sees the old key's jobs, and cancels one; the old key is refused at once, everywhere.
    seen = answer(other.get("/v1/jobs", headers=auth(rotated["secret"])), 200)["data"]
    assert {j["id"] for j in seen} == {job["id"], queued["id"]}
    answer(api.post(f"/v1/jobs/{queued['id']}/cancel", headers=auth(rotated["secret"])), 200)
    for process in (api, other):
        assert process.get("/v1/jobs", headers=auth(made["secret"])).status_code == 401

    # Revoked on one process: the next request there gets 401, and the other process refuses it within
    # its key cache's bound (KEY_CACHE_S; it answered 200 just before, so it remembers the key).
    assert other.get(f"/v1/jobs/{job['id']}", headers=auth(rotated["secret"])).status_code == 200
    revoked = answer(api.delete(f"/v1/keys/{rotated['id']}", headers=auth(ROOT)), 200)
    assert revoked["revoked_at"] is not None
    assert api.get(f"/v1/jobs/{job['id']}", headers=auth(rotated["secret"])).status_code == 401
    assert wait_for(
        lambda: other.get(f"/v1/jobs/{job['id']}", headers=auth(rotated["secret"])).status_code == 401,
        timeout_s=KEY_CACHE_S + 5,
        interval_s=0.1,
    )
    assert answer(api.delete(f"/v1/keys/{rotated['id']}", headers=auth(ROOT)), 409)["error"]["code"]
    assert api.delete("/v1/keys/999999", headers=auth(ROOT)).status_code == 404

    # The jobs are the owner's, not the key's; their events name who created and cancelled them.
    with db.engine.connect() as connection:
        assert set(connection.scalars(select(Job.owner))) == {"bob"}
    created = events_of(other, queued["id"])[0]["data"]["actor"]
    assert (created["owner"], created["key_id"]) == ("bob", made["id"]) and "bob-laptop" in created["key"]
    cancelled = events_of(other, queued["id"])[-1]["data"]
    assert (cancelled["status"], cancelled["actor"]["key_id"]) == ("cancelled", rotated["id"])

    # The audit log: each change, with the acting owner, newest first, in pages.
    audit = answer(api.get("/v1/audit", headers=auth(ROOT)), 200)
    assert [(e["action"], e["actor"], e["target"]) for e in audit["data"]] == [
        ("key.revoke", "root", f"key {rotated['id']}"),
        ("key.rotate", "root", f"key {rotated['id']}"),
        ("key.revoke", "root", f"key {made['id']}"),
        ("key.create", "root", f"key {made['id']}"),
    ]
    first = answer(api.get("/v1/audit", params={"limit": 3}, headers=auth(ROOT)), 200)
    assert first["has_more"] and first["next_cursor"] == str(audit["data"][2]["id"])
    rest = answer(api.get("/v1/audit", params={"after": first["next_cursor"]}, headers=auth(ROOT)), 200)
    assert [e["action"] for e in rest["data"]] == ["key.create"] and not rest["has_more"]

    # Lists: every key, never a secret nor a digest; revoked ones only when asked for.
    assert answer(api.get("/v1/keys", headers=auth(ROOT)), 200)["data"] == []
    listed = api.get("/v1/keys", params={"include_revoked": "true", "owner": "bob"}, headers=auth(ROOT))
    assert [k["id"] for k in answer(listed, 200)["data"]] == [made["id"], rotated["id"]]
    with db.session() as session:
        digests = [key.digest for key in api_keys.list_keys(session, include_revoked=True)]
    everything = [
        listed.text,
        json.dumps(audit),
        json.dumps(events_of(api, job["id"]) + events_of(api, queued["id"])),
        *(log.read_text() for log in logs),
    ]
    assert all('"GET /v1/jobs' in log.read_text() for log in logs)  # each access log was written
    for secret in (made["secret"], rotated["secret"], *digests):
        assert not [i for i, part in enumerate(everything) if secret in part], secret


def test_expired_read_only_and_refused_keys(keyed: Settings, db: Database) -> None:
    with live_api(keyed) as api:
        # Only an admin makes keys; a bad owner is refused naming the field, and nothing is stored.
        refused = answer(api.post("/v1/keys", json={"owner": "dave"}, headers=auth(CAROL)), 403)
        assert refused["error"]["code"] == "forbidden"
        for body in ({"owner": "no spaces"}, {"owner": "-dash"}, {"owner": "x" * 65}, {}):
            error = answer(api.post("/v1/keys", json=body, headers=auth(ROOT)), 422)["error"]
            assert error["field"] == "owner", error
        for body, field in (
            ({"owner": "dave", "role": "root"}, "role"),
            ({"owner": "dave", "expires_in_days": 0}, "expires_in_days"),
            ({"owner": "dave", "expires_at": "2001-01-01T00:00:00Z"}, "expires_at"),
        ):
            assert answer(api.post("/v1/keys", json=body, headers=auth(ROOT)), 422)["error"]["field"] == field
        assert count_rows(db, ApiKey) == 0

        # A read-only key reads its owner's jobs; it submits, cancels and makes keys nothing.
        job = answer(api.post("/v1/jobs", json={"spec": SPEC}, headers=auth(CAROL)), 201)
        reader = make_key(api, "carol", role="read-only")
        assert reader["name"] == "carol-key" and reader["role"] == "read-only"
        seen = answer(api.get("/v1/jobs", headers=auth(reader["secret"])), 200)["data"]
        assert [j["id"] for j in seen] == [job["id"]]
        answer(api.get(f"/v1/jobs/{job['id']}", headers=auth(reader["secret"])), 200)
        for path, body in (("/v1/jobs", {"spec": SPEC}), (f"/v1/jobs/{job['id']}/cancel", None)):
            assert api.post(path, json=body, headers=auth(reader["secret"])).status_code == 403
        as_reader = auth(reader["secret"])
        assert api.post("/v1/keys", json={"owner": "carol"}, headers=as_reader).status_code == 403
        assert api.get("/v1/keys", headers=as_reader).status_code == 403
        assert api.get("/v1/audit", headers=auth(CAROL)).status_code == 403
        assert answer(api.get(f"/v1/jobs/{job['id']}", headers=auth(CAROL)), 200)["status"] == "queued"
        # An admin's rerun stays carol's job; its first event names the admin who queued it.
        rerun = answer(api.post(f"/v1/jobs/{job['id']}/rerun", headers=auth(ROOT)), 201)
        answer(api.get(f"/v1/jobs/{rerun['id']}", headers=auth(reader["secret"])), 200)
        by_root = {"owner": "root", "key": "configured", "key_id": None}
        assert events_of(api, rerun["id"])[0]["data"]["actor"] == by_root

        # A sweep's jobs name who queued and who cancelled them too.
        sweep = answer(api.post("/v1/sweeps", json={"spec": SPEC, "seeds": [1]}, headers=auth(CAROL)), 201)
        answer(api.post(f"/v1/sweeps/{sweep['id']}/cancel", headers=auth(ROOT)), 200)
        by_carol = {"owner": "carol", "key": "configured", "key_id": None}
        sweep_events = [e["data"] for e in events_of(api, sweep["job_ids"][0])]
        assert [(d["status"], d["actor"]) for d in sweep_events] == [
            ("queued", by_carol),
            ("cancelled", by_root),
        ]

        # An expiring key works until its time has passed, then gets 401.
        expiring = make_key(api, "erin", expires_in_days=1)
        assert expiring["expires_at"] is not None
        assert api.get("/v1/jobs", headers=auth(expiring["secret"])).status_code == 200
        with db.engine.begin() as connection:
            past = utcnow() - timedelta(seconds=1)
            connection.execute(update(ApiKey).where(ApiKey.id == expiring["id"]).values(expires_at=past))
        # An expiry moved earlier in the row is seen once the key cache reads the row again.
        assert wait_for(
            lambda: api.get("/v1/jobs", headers=auth(expiring["secret"])).status_code == 401,
            timeout_s=KEY_CACHE_S + 5,
            interval_s=0.1,
        )


def test_keys_are_made_only_while_auth_is_on(settings: Settings, db: Database) -> None:
    with live_api(settings) as api:
        error = answer(api.post("/v1/keys", json={"owner": "bob"}), 409)["error"]
        assert "GLUEJOBS_ADMIN_KEYS" in error["message"]
    assert count_rows(db, ApiKey) == 0


# ---------------------------------------------------------------------------------------------------
# Migration: jobs owned by a configured key's digest (before owners) stay visible to that key
# ---------------------------------------------------------------------------------------------------

ALICE_OLD = "alice-old-key-0123456789abcdef"
UNNAMED_OLD = "unnamed-old-key-0123456789abcdef"


@pytest.fixture
def bare_db_url(db_url: str) -> str:
    """`db_url`'s database, emptied of every table (the fixtures hand it over migrated)."""
    url = make_url(db_url)
    if url.get_backend_name() == "sqlite":
        Path(str(url.database)).unlink()
        return db_url
    db = Database(db_url)
    with db.engine.begin() as connection:
        connection.execute(text("DROP SCHEMA public CASCADE"))
        connection.execute(text("CREATE SCHEMA public"))
    db.dispose()
    return db_url


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _insert_old_jobs(db: Database, owners: list[str]) -> None:
    with db.engine.begin() as connection:
        jobs = Table("jobs", MetaData(), autoload_with=connection)
        now = utcnow()
        row = {
            "status": "queued",
            "spec": SPEC,
            "priority": 0,
            "metadata": {},
            "attempts": 0,
            "max_attempts": 3,
            "created_at": now,
            "updated_at": now,
            "latest_metrics": {},
            "num_processes": 1,
            "warnings": [],
        }
        known = {name: value for name, value in row.items() if name in jobs.c}
        for owner in owners:
            connection.execute(insert(jobs).values({**known, "owner": owner}))


def test_jobs_of_configured_keys_migrate_to_owners(
    bare_db_url: str, settings_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = Database(bare_db_url)
    upgrade(db, "0007")
    with db.engine.connect() as connection:
        assert connection.scalar(text("SELECT version_num FROM alembic_version")) == "0007"
    _insert_old_jobs(db, [_digest(ALICE_OLD), _digest(UNNAMED_OLD), _digest(ALICE_OLD)])
    configured = f"alice={ALICE_OLD},{UNNAMED_OLD}"
    monkeypatch.setenv("GLUEJOBS_API_KEYS", configured)  # what the migration reads, as in a deployment
    upgrade(db)
    with db.engine.connect() as connection:
        owners = list(connection.scalars(select(Job.owner).order_by(Job.id)))
    unnamed = unnamed_owner(_digest(UNNAMED_OLD))
    assert owners == ["alice", unnamed, "alice"] and unnamed.startswith("key-") and len(unnamed) == 16

    settings = settings_factory(bare_db_url, api_keys=[f"alice={ALICE_OLD}", UNNAMED_OLD], admin_keys=[ROOT])
    with live_api(settings) as api:
        alices = answer(api.get("/v1/jobs", headers=auth(ALICE_OLD)), 200)["data"]
        theirs = answer(api.get("/v1/jobs", headers=auth(UNNAMED_OLD)), 200)["data"]
        assert sorted(j["id"] for j in alices) == [1, 3] and [j["id"] for j in theirs] == [2]
        assert api.get("/v1/jobs/2", headers=auth(ALICE_OLD)).status_code == 404
        assert api.get("/v1/jobs/1", headers=auth(UNNAMED_OLD)).status_code == 404
        # A key made for alice over the API sees the jobs her configured key made.
        made = make_key(api, "alice")
        assert len(answer(api.get("/v1/jobs", headers=auth(made["secret"])), 200)["data"]) == 2
    db.dispose()


# ---------------------------------------------------------------------------------------------------
# The client and the command line
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_client_manages_keys_and_reads_the_audit_log(keyed: Settings) -> None:
    import asyncio

    from gluejobs import ApiError, ApiKeyInfo, AsyncClient, AuditEntry, Client

    with live_api(keyed) as api, Client(str(api.base_url), api_key=ROOT) as client:
        made = client.keys.create(owner="bob", role="read-only", expires_in_days=2)
        assert isinstance(made, ApiKeyInfo) and made.secret and made.expires_at is not None
        assert [(k.id, k.secret) for k in client.keys.list(owner="bob")] == [(made.id, None)]
        rotated = client.keys.rotate(made.id)
        assert rotated.secret and rotated.role == "read-only" and rotated.rotated_from == made.id
        assert client.keys.revoke(rotated.id).revoked_at is not None
        assert client.keys.list() == [] and len(client.keys.list(include_revoked=True)) == 2
        entries = list(client.audit.list(page_size=2))
        assert all(isinstance(e, AuditEntry) for e in entries)
        assert [e.action for e in entries] == ["key.revoke", "key.rotate", "key.revoke", "key.create"]
        with pytest.raises(ApiError) as refused:
            client.keys.create(owner="not a name")
        assert (refused.value.status_code, refused.value.field) == (422, "owner")

        async def scenario() -> None:
            async with AsyncClient(str(api.base_url), api_key=ROOT) as aclient:
                key = await aclient.keys.create(owner="dave", name="dave-ci")
                assert [k.name for k in await aclient.keys.list(owner="dave")] == ["dave-ci"]
                assert (await aclient.keys.rotate(key.id)).secret
                assert (await aclient.keys.revoke(key.id + 1)).owner == "dave"
                assert {e.actor async for e in aclient.audit.list()} == {"root"}

        asyncio.run(scenario())


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_keys_commands(keyed: Settings, db: Database, capsys: pytest.CaptureFixture[str]) -> None:
    with live_api(keyed) as api:
        url = str(api.base_url)

        def cli(*argv: str) -> tuple[int, str, str]:
            code = main([*argv, "--url", url, "--api-key", ROOT])
            out, err = capsys.readouterr()
            return code, out, err

        code, out, err = cli("keys", "create", "bob", "--role", "read-only", "--name", "bob-ci")
        assert code == 0 and "will not be shown again" in err
        summary, secret = out.splitlines()
        assert summary.startswith("key 1 (bob-ci) for bob, role read-only") and secret.startswith("gj_")
        assert api.get("/v1/jobs", headers=auth(secret)).status_code == 200

        code, out, _ = cli("keys", "ls")
        assert code == 0 and out.splitlines()[0].split()[:4] == ["id", "name", "owner", "role"]
        assert "bob-ci" in out and secret not in out
        code, out, err = cli("keys", "rotate", "1", "--json")
        rotated = json.loads(out)
        assert code == 0 and rotated["id"] == 2 and rotated["secret"] and "not be shown again" in err
        assert api.get("/v1/jobs", headers=auth(secret)).status_code == 401
        code, out, _ = cli("keys", "revoke", "2")
        assert code == 0 and out.strip() == "key 2 (bob-ci, bob) revoked"
        code, _, err = cli("keys", "revoke", "2")
        assert code == 2 and err.startswith("gluejobs keys: ") and "revoked" in err
        assert [k["id"] for k in json.loads(cli("keys", "ls", "--all", "--json")[1])] == [1, 2]
        code, out, _ = cli("audit")
        # id, when (one word: ISO 8601 UTC), actor, action, target
        assert code == 0 and out.splitlines()[1].split()[3:5] == ["key.revoke", "key"]
        assert [e["action"] for e in json.loads(cli("audit", "--json")[1])][-1] == "key.create"
        code, _, err = cli("keys", "create", "two words")
        assert code == 2 and "owner" in err

        # `keys ls --json | head -c 10`: more than a pipe holds, and a reader that stops early.
        with db.session() as session:
            for n in range(300):
                api_keys.create_key(
                    session,
                    owner=f"owner{n}",
                    role=KeyRole.user,
                    name=f"key-{n}",
                    expires_at=None,
                    actor=None,
                )
        process = subprocess.Popen(
            [sys.executable, "-m", "gluejobs.cli", "keys", "ls", "--json", "--url", url, "--api-key", ROOT],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert process.stdout is not None and process.stderr is not None
        assert len(process.stdout.read(10)) == 10
        process.stdout.close()  # what `head -c 10` does once it has its bytes
        stderr = process.stderr.read().decode()
        assert process.wait(60) == 0 and stderr == "", stderr


def test_auth_fails_closed_without_configured_keys(
    bare_db_url: str, settings_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without configured keys, whether auth is on depends on the database holding keys: a database
    that cannot say (here: not migrated yet) keeps the API closed, and a key once made — even one
    revoked since — keeps it closed at every later start."""
    from fastapi.testclient import TestClient

    from service.accounts.auth import StoredKeysFlag
    from service.main import create_app

    monkeypatch.setattr(StoredKeysFlag, "RECHECK_S", 0.0)
    settings = settings_factory(bare_db_url)  # no keys configured
    db = Database(settings.database_url)
    unmigrated = TestClient(create_app(settings, db), base_url="http://127.0.0.1")
    # It cannot tell: closed, never open. SQLite's "no such table" reads as the database being away
    # (503, as any request then); Postgres' undefined table is an answer, taken as "keys exist" (401).
    closed = 503 if make_url(bare_db_url).get_backend_name() == "sqlite" else 401
    assert unmigrated.get("/v1/jobs").status_code == closed
    upgrade(db)
    assert unmigrated.get("/v1/jobs").status_code == 200  # asked again: no keys, the open set-up
    with db.session() as session:
        key, _secret = api_keys.create_key(
            session, owner="alice", role=KeyRole.user, name="laptop", expires_at=None, actor=None
        )
        api_keys.revoke_key(session, key_id=key.id, actor=None)
    restarted = TestClient(create_app(settings, db), base_url="http://127.0.0.1")
    assert restarted.get("/v1/jobs").status_code == 401
    db.dispose()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_two_keys_named_for_one_owner_bring_their_jobs_and_replays_along(
    bare_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """alice=<k1>, alice=<k2>: both keys' rows move to alice, and an Idempotency-Key both had used
    (unique per owner) does not stop the move."""
    from shared.core.owners import adopt_configured_owners, configured_keys

    db = Database(bare_db_url)
    upgrade(db, "0007")
    first, second = "alice-first-key-0123456789", "alice-second-key-0123456789"
    _insert_old_jobs(db, [_digest(first), _digest(second)])
    with db.engine.begin() as connection:
        replays = Table("idempotency_keys", MetaData(), autoload_with=connection)
        job_ids = list(connection.scalars(select(Table("jobs", MetaData(), autoload_with=connection).c.id)))
        for job_id, key in zip(job_ids[:2], (first, second), strict=True):
            connection.execute(
                insert(replays).values(
                    owner=_digest(key), key="same", request_hash="0" * 64, job_id=job_id, created_at=utcnow()
                )
            )
    upgrade(db)
    settings = Settings(database_url=bare_db_url, api_keys=[f"alice={first}", f"alice={second}"])  # type: ignore[call-arg]
    with db.engine.begin() as connection:
        adopt_configured_owners(connection, configured_keys(settings))
    with db.session() as session, session.begin():
        owners = set(session.scalars(select(Job.owner)))
    assert owners == {"alice"}
    assert count_rows(db, IdempotencyKey) == 1
    db.dispose()


def test_requests_arriving_while_the_database_is_first_asked_wait_for_its_answer() -> None:
    """The demo's set-up (no keys anywhere): requests that arrive together at a fresh API must all
    be let in, not refused with 401 by a default read before the database has answered."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from service.accounts.auth import StoredKeysFlag

    asked = []

    def slow_no_keys() -> bool:
        asked.append(1)
        time.sleep(0.2)
        return False

    flag = StoredKeysFlag(slow_no_keys)
    start = threading.Barrier(8)

    def present(_: int) -> bool:
        start.wait()
        return flag.present()

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(present, range(8)))
    assert answers == [False] * 8
    assert len(asked) == 1  # asked once, not once per request
