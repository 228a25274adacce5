"""Files under GLUEJOBS_DATA_DIR belong to someone: with API keys, a key's paths resolve in its owner's
folder (owners/<owner>/) and cannot leave it, on every route that takes a path (submit, dry run,
sweep, rerun); an admin key may name any file, but error messages quote nothing from files the
caller does not own; a worker, which knows only GLUEJOBS_DATA_DIR, finds the stored paths. Two user
keys and an admin key against a live API, SQLite and Postgres."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from shared.core.config import Settings
from shared.core.db import Database
from shared.core.errors import quote
from shared.core.owners import unnamed_owner
from shared.core.tables import Job
from shared.data.reading import DataError, spec_file_paths
from shared.jobspec.data_scope import OWNERS_DIR, owner_folder
from shared.jobspec.spec import JobSpec
from tests.support.dbutil import count_rows
from tests.support.e2e import live_api
from tests.support.kit import ALICE, BOB, ROOT, auth

SECRET = "SSN-123-45-6789"


def folder_of(key: str) -> str:
    return f"{OWNERS_DIR}/{owner_folder(unnamed_owner(hashlib.sha256(key.encode()).hexdigest()))}"


@pytest.fixture
def keyed(settings_factory: Any, db_url: str) -> Settings:
    settings: Settings = settings_factory(db_url, api_keys=[ALICE, BOB], admin_keys=[ROOT])
    for key in (ALICE, BOB):
        own = settings.data_dir / folder_of(key)
        own.mkdir(parents=True)
        (own / "good.csv").write_text("sentence,label\na fine film,1\na dull film,0\n")
        (own / "secret.csv").write_text(f"sentence,label\na fine film,1\nmy number,{SECRET}\n")
    return settings


@pytest.fixture
def api(keyed: Settings) -> Iterator[httpx.Client]:
    with live_api(keyed) as client:
        yield client


def spec(train_file: str) -> dict[str, Any]:
    return {"model_name_or_path": "tiny-bert", "task_name": "sst2", "train_file": train_file, "seed": 1}


def refused(response: httpx.Response, sent: str | None = None, field: str = "spec.train_file") -> str:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["field"] == field, error
    message: str = error["message"]
    assert SECRET not in response.text
    # No server path either, besides the caller's own value quoted back (whole, or cut short).
    shown = message.replace(repr(sent), "").replace(quote(sent), "") if sent else message
    assert "/tmp" not in shown, message
    return message


def test_a_key_reaches_only_its_owners_files(api: httpx.Client, keyed: Settings, db: Database) -> None:
    alices = folder_of(ALICE)
    # Alice's file in its stored form names a file in Bob's own folder, which does not exist.
    stored_form = api.post("/v1/jobs", json={"spec": spec(f"{alices}/good.csv")}, headers=auth(BOB))
    assert (
        refused(stored_form)
        == f"train_file '{folder_of(BOB)}/{alices}/good.csv' not found in GLUEJOBS_DATA_DIR"
    )
    for path in (
        f"../{alices.split('/')[1]}/good.csv",
        f"../../{alices}/good.csv",
        str(keyed.data_dir.resolve() / alices / "good.csv"),  # absolute
        "../../good.csv",
    ):
        body = {"spec": spec(path)}
        bob = auth(BOB)
        for response in (
            api.post("/v1/jobs", json=body, headers=bob),
            api.post("/v1/jobs", params={"dry_run": "true"}, json=body, headers=bob),
        ):
            message = refused(response, path)
            assert f"the data folder GLUEJOBS_DATA_DIR/{folder_of(BOB)}" in message, message
        unseeded = {k: v for k, v in spec(path).items() if k != "seed"}
        sweep = api.post("/v1/sweeps", json={"spec": unseeded, "seeds": [1, 2]}, headers=bob)
        assert sweep.status_code == 422 and sweep.json()["error"]["field"] == "spec.train_file", sweep.text
        assert SECRET not in sweep.text
        grid = {
            "spec": {"model_name_or_path": "tiny-bert", "task_name": "sst2"},
            "grid": {"train_file": [path]},
        }
        assert api.post("/v1/sweeps", json=grid, headers=bob).status_code == 422
    # A link in Bob's folder to Alice's file is followed, and refused.
    os.symlink(keyed.data_dir / alices / "secret.csv", keyed.data_dir / folder_of(BOB) / "link.csv")
    refused(
        api.post("/v1/jobs", params={"dry_run": "true"}, json={"spec": spec("link.csv")}, headers=auth(BOB))
    )
    assert count_rows(db, Job) == 0


def test_a_key_names_its_own_files_as_it_likes_and_sees_their_values(
    api: httpx.Client, keyed: Settings, db: Database
) -> None:
    alices = folder_of(ALICE)
    created = api.post("/v1/jobs", json={"spec": spec("good.csv")}, headers=auth(ALICE))
    assert created.status_code == 201, created.text
    stored = created.json()["spec"]["train_file"]
    assert stored == f"{alices}/good.csv"  # relative to GLUEJOBS_DATA_DIR: what a worker resolves
    # The stored form names the same file (a resubmitted spec), and so does a rerun.
    again = api.post("/v1/jobs", json={"spec": spec(stored)}, headers=auth(ALICE))
    assert again.status_code == 201 and again.json()["spec"]["train_file"] == stored, again.text
    rerun = api.post(f"/v1/jobs/{created.json()['id']}/rerun", headers=auth(ALICE))
    assert rerun.status_code == 201, rerun.text
    # A worker knows only GLUEJOBS_DATA_DIR: the stored path leads it to Alice's file.
    paths = spec_file_paths(JobSpec.model_validate(created.json()["spec"]), keyed)
    assert paths["train_file"] == (keyed.data_dir / alices / "good.csv").resolve()
    # Her own file's values are hers to see.
    mine = api.post(
        "/v1/jobs", params={"dry_run": "true"}, json={"spec": spec("secret.csv")}, headers=auth(ALICE)
    )
    assert mine.status_code == 422
    assert f"label '{SECRET}' on row 2 does not fit the task" in mine.json()["error"]["message"]
    assert count_rows(db, Job) == 3


def test_an_admin_reaches_every_file_but_sees_no_others_values(api: httpx.Client, keyed: Settings) -> None:
    alices = folder_of(ALICE)
    good = api.post(
        "/v1/jobs", params={"dry_run": "true"}, json={"spec": spec(f"{alices}/good.csv")}, headers=auth(ROOT)
    )
    assert good.status_code == 200, good.text
    for params in ({"dry_run": "true"}, {}):
        response = api.post(
            "/v1/jobs", params=params, json={"spec": spec(f"{alices}/secret.csv")}, headers=auth(ROOT)
        )
        message = refused(response)
        assert "label (value withheld: not your file) on row 2 does not fit the task" in message, message
    # The admin's own folder is theirs: its values are quoted.
    own = keyed.data_dir / folder_of(ROOT)
    own.mkdir(parents=True)
    (own / "secret.csv").write_text(f"sentence,label\nmine,{SECRET}\n")
    mine = api.post("/v1/jobs", json={"spec": spec(f"{folder_of(ROOT)}/secret.csv")}, headers=auth(ROOT))
    assert mine.status_code == 422 and SECRET in mine.json()["error"]["message"]


def test_a_worker_refuses_a_link_out_of_an_owners_folder(keyed: Settings) -> None:
    """A link put into Alice's folder after her job was stored still cannot lead the worker to Bob's file."""
    alices, bobs = keyed.data_dir / folder_of(ALICE), keyed.data_dir / folder_of(BOB)
    os.symlink(bobs / "secret.csv", alices / "later.csv")
    stored = JobSpec.model_validate(spec(f"{folder_of(ALICE)}/later.csv"))
    with pytest.raises(DataError, match=f"leaves the data folder GLUEJOBS_DATA_DIR/{folder_of(ALICE)}"):
        spec_file_paths(stored, keyed)


def test_without_keys_the_whole_data_folder_is_the_one_users(settings_factory: Any, db_url: str) -> None:
    settings: Settings = settings_factory(db_url)
    (settings.data_dir / "secret.csv").write_text(f"sentence,label\na fine film,1\nmy number,{SECRET}\n")
    (settings.data_dir / "good.csv").write_text("sentence,label\na fine film,1\na dull film,0\n")
    with live_api(settings) as client:
        created = client.post("/v1/jobs", json={"spec": spec("good.csv")})
        assert created.status_code == 201 and created.json()["spec"]["train_file"] == "good.csv"
        bad = client.post("/v1/jobs", json={"spec": spec("secret.csv")})
        assert bad.status_code == 422 and SECRET in bad.json()["error"]["message"]
