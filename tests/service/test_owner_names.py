"""Owner names (issue 21, findings 7 and 11), on SQLite and Postgres:

- no key can be made for, and no owner made under, a name the service derives for configured keys
  (`key-<12 hex>`, a bare digest): at the next start its jobs and files would be handed to the
  configured key's owner;
- a key made under such a name before they were refused keeps its jobs and files across a restart;
- every route that takes an owner's name refuses the same names the same way.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.accounts import api_keys
from service.main import create_app
from shared.core.config import Settings
from shared.core.db import Database
from shared.core.owners import unnamed_owner
from shared.core.tables import KeyRole
from tests.support.e2e import LOOPBACK_URL
from tests.support.kit import auth

ROOT = "root-admin-key-0123456789abcdef"
ALICE = "alice-user-key-0123456789abcdef"
UNNAMED = "unnamed-user-key-0123456789abcdef"
TRAIN = b"sentence,label\n" + b"".join(f"a fine sentence number {i},{i % 2}\n".encode() for i in range(40))
SPEC = {"model_name_or_path": "tiny-bert", "train_file": "train.csv", "eval_strategy": "no"}
BAD_NAMES = ["ålice", "a b", ".hidden", "-x", "x" * 65, ""]


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture
def keyed(settings_factory: Any, db_url: str) -> Settings:
    settings: Settings = settings_factory(
        db_url, admin_keys=[f"root={ROOT}"], api_keys=[f"alice={ALICE}", UNNAMED], check_data_on_submit=False
    )
    return settings


@pytest.fixture
def api(keyed: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(keyed), base_url=LOOPBACK_URL) as client:
        yield client


def test_no_key_is_made_for_a_name_the_service_derives(api: TestClient) -> None:
    derived = [unnamed_owner(digest(ALICE)), unnamed_owner(digest("any")), "KEY-0123456789ab", digest(ALICE)]
    for name in derived:
        made = api.post("/v1/keys", json={"owner": name}, headers=auth(ROOT))
        owner = api.patch(f"/v1/owners/{name}", json={"share": 2}, headers=auth(ROOT))

        assert made.status_code == 422 and made.json()["error"]["field"] == "owner", made.text
        assert owner.status_code == 422 and owner.json()["error"]["field"] == "name", owner.text
    listed = [o["name"] for o in api.get("/v1/owners", headers=auth(ROOT)).json()["data"]]
    assert not set(derived) & set(listed)


def test_the_owner_of_an_unnamed_configured_key_keeps_its_quotas(api: TestClient) -> None:
    name = unnamed_owner(digest(UNNAMED))
    changed = api.patch(f"/v1/owners/{name}", json={"share": 2}, headers=auth(ROOT))
    assert changed.status_code == 200 and changed.json()["share"] == 2, changed.text


def test_every_route_that_takes_an_owner_name_refuses_the_same_names(api: TestClient) -> None:
    for name in BAD_NAMES:
        made = api.post("/v1/keys", json={"owner": name}, headers=auth(ROOT))
        owner = api.patch(f"/v1/owners/{name}", json={"share": 2}, headers=auth(ROOT)) if name else None
        listed = api.get("/v1/keys", params={"owner": name}, headers=auth(ROOT))

        assert made.status_code == 422, (name, made.text)
        assert owner is None or owner.status_code == 422, (name, owner.text)
        assert listed.status_code == 422, (name, listed.text)
    names = [o["name"] for o in api.get("/v1/owners", headers=auth(ROOT)).json()["data"]]
    assert not set(BAD_NAMES) & set(names)


def test_a_key_made_for_a_derived_name_keeps_its_jobs_and_files_across_a_restart(
    keyed: Settings, db_url: str
) -> None:
    """Finding 7's restart: a key for `key-<alice's configured key>` (made before such names were
    refused: straight into the database) uploads a file and submits a job; after a restart alice
    must not have them."""
    taken = unnamed_owner(digest(ALICE))
    with Database(db_url).session() as session:
        _key, secret = api_keys.create_key(
            session, owner=taken, role=KeyRole.user, name="old", expires_at=None, actor="root"
        )
    with TestClient(create_app(keyed), base_url=LOOPBACK_URL) as api:
        uploaded = api.post("/v1/files", files={"file": ("train.csv", TRAIN)}, headers=auth(secret))
        assert uploaded.status_code == 201, uploaded.text
        job = api.post(
            "/v1/jobs", json={"spec": {**SPEC, "train_file": uploaded.json()["id"]}}, headers=auth(secret)
        )
        assert job.status_code == 201, job.text

    with TestClient(create_app(keyed), base_url=LOOPBACK_URL) as api:  # the restart
        assert api.get("/v1/jobs", headers=auth(ALICE)).json()["data"] == []
        assert api.get("/v1/files", headers=auth(ALICE)).json()["data"] == []
        assert [j["id"] for j in api.get("/v1/jobs", headers=auth(secret)).json()["data"]] == [
            job.json()["id"]
        ]
        assert [f["id"] for f in api.get("/v1/files", headers=auth(secret)).json()["data"]] == [
            uploaded.json()["id"]
        ]
