"""Uploads are never half-stored, and dedup says nothing of other owners' files (issue 21, findings 5
and 9), on both databases and both stores (a local folder, moto's S3 server):

- inputs no database stores faithfully (a NUL in the filename, a label or a column name; a
  non-finite label; a filename over 255 characters) get 422 naming the field before any byte reaches
  the store, on SQLite and Postgres alike;
- a database write that fails after the bytes were stored removes them again;
- an API killed between the store write and the row insert (or in the middle of the write) leaves
  an object the orphan sweep removes at the next start;
- bytes another owner already has are stored exactly as new bytes are: the same answer, the same
  store operations.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from service.files.stored_files import sweep_orphans
from service.main import create_app
from shared import jobs_repo
from shared.core.config import Settings
from shared.core.db import Database
from shared.core.faults import CRASH_AT_ENV
from shared.core.storage import Store, file_key, open_store
from tests.support.e2e import LOOPBACK_URL, api_process, wait_for
from tests.support.kit import ALICE

BOB = "bob-key-0123456789abcdefgh"
TRAIN = b"sentence,label\n" + b"".join(f"a fine sentence number {i},{i % 2}\n".encode() for i in range(40))


def as_(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# Where the store matters and the database does not (the row is never written, or its write is made
# to fail), each store runs on one database: both are covered, and the suite stays fast.
STORES = [
    pytest.param(("local", "sqlite"), id="local-sqlite"),
    pytest.param(("s3", "postgres"), id="s3-postgres"),
]


@pytest.fixture(params=STORES)
def keyed(request: pytest.FixtureRequest, settings_factory: Any) -> Settings:
    """Two owners' keys, on a store and a database."""
    store, database = request.param
    store_url = request.getfixturevalue("s3_url") if store == "s3" else None
    return _keyed(settings_factory, request.getfixturevalue(f"{database}_url"), store_url)


@pytest.fixture
def keyed_local(settings_factory: Any, db_url: str) -> Settings:
    """The same on the local store only: for what is refused before the store is touched."""
    return _keyed(settings_factory, db_url, None)


def _keyed(settings_factory: Any, db_url: str, store_url: str | None) -> Settings:
    settings: Settings = settings_factory(
        db_url, storage_url=store_url, api_keys=[f"alice={ALICE}", f"bob={BOB}"], orphan_grace_s=0.0
    )
    open_store(settings).check()
    return settings


@pytest.fixture
def client(keyed: Settings) -> Iterator[TestClient]:
    # A failure inside the app answers 500 here, as it does behind a server.
    with TestClient(create_app(keyed), base_url=LOOPBACK_URL, raise_server_exceptions=False) as test_client:
        yield test_client


def stored(settings: Settings) -> list[str]:
    """Every object under files/, partial ones included."""
    store = open_store(settings)
    return [f.path for f in store.list("files")]


def multipart(filename: bytes, content: bytes) -> tuple[bytes, dict[str, str]]:
    """A multipart body built by hand: httpx refuses to send a NUL in a filename, an attacker does not."""
    boundary = secrets.token_hex(8)
    body = (
        f"--{boundary}\r\n".encode()
        + b'Content-Disposition: form-data; name="file"; filename="'
        + filename
        + b'"\r\nContent-Type: application/octet-stream\r\n\r\n'
        + content
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}", **as_(ALICE)}


def jsonl(rows: list[str]) -> bytes:
    return "".join(f"{row}\n" for row in rows).encode()


def labelled(odd_one: str) -> bytes:
    """20 JSON lines of labels 0 and 1, the fourth one's label `odd_one` (raw JSON text)."""
    return jsonl([f'{{"sentence": "row {i}", "label": {odd_one if i == 3 else i % 2}}}' for i in range(20)])


NUL = "\\u0000"  # as JSON writes it
UNSTORABLE = [
    pytest.param(b"tr\x00ain.csv", TRAIN, "file.filename", id="nul-in-filename"),
    pytest.param(b"a" * 252 + b".csv", TRAIN, "file.filename", id="filename-over-255"),
    pytest.param(b"train.jsonl", labelled("Infinity"), "file.labels", id="infinite-label"),
    pytest.param(b"train.jsonl", labelled("-Infinity"), "file.labels", id="minus-infinite-label"),
    pytest.param(
        b"train.jsonl",
        jsonl([f'{{"sentence": "row {i}", "label": "{NUL if i == 3 else ""}q{i % 2}"}}' for i in range(20)]),
        "file.labels",
        id="nul-in-label",
    ),
    pytest.param(
        b"train.csv",
        b"sentence,label,ex\x00tra\n" + b"".join(f"row {i},{i % 2},x\n".encode() for i in range(20)),
        "file.columns",
        id="nul-in-column-name",
    ),
]


def test_unstorable_uploads_get_422_naming_the_field_and_store_nothing(keyed_local: Settings) -> None:
    """On both databases (db_url): they used to be a 500 on Postgres, stored on SQLite."""
    with TestClient(create_app(keyed_local), base_url=LOOPBACK_URL, raise_server_exceptions=False) as client:
        for case in UNSTORABLE:
            filename, content, field = case.values
            body, headers = multipart(filename, content)
            answer = client.post("/v1/files", content=body, headers=headers)

            assert answer.status_code == 422, (case.id, answer.text)
            assert answer.json()["error"]["field"] == field, case.id
            assert stored(keyed_local) == [], case.id
        assert client.get("/v1/files", headers=as_(ALICE)).json()["data"] == []


def test_a_database_write_that_fails_after_the_store_write_removes_the_bytes(
    client: TestClient, keyed: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("the insert failed")

    monkeypatch.setattr(jobs_repo, "add_file", failing)
    answer = client.post("/v1/files", files={"file": ("train.csv", TRAIN)}, headers=as_(ALICE))

    assert answer.status_code == 500
    assert stored(keyed) == []


def test_a_failed_write_keeps_bytes_another_file_holds(
    client: TestClient, keyed: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    bobs = client.post("/v1/files", files={"file": ("train.csv", TRAIN)}, headers=as_(BOB))
    assert bobs.status_code == 201, bobs.text

    def failing(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("the insert failed")

    monkeypatch.setattr(jobs_repo, "add_file", failing)
    answer = client.post("/v1/files", files={"file": ("train.csv", TRAIN)}, headers=as_(ALICE))

    assert answer.status_code == 500
    assert stored(keyed) == [bobs.json()["sha256"]]  # Bob's file still has its bytes


class RecordingStore(Store):
    """The app's store, recording every operation and its key."""

    calls: list[tuple[str, str]]

    def exists(self, key: str) -> bool:
        self.calls.append(("exists", key))
        return super().exists(key)

    def put(self, local: Path, key: str) -> None:
        self.calls.append(("put", key))
        super().put(local, key)

    def delete(self, key: str) -> None:
        self.calls.append(("delete", key))
        super().delete(key)


def test_bytes_another_owner_has_are_stored_as_new_bytes_are(client: TestClient, keyed: Settings) -> None:
    store = client.app.state.store  # type: ignore[attr-defined]
    recording = RecordingStore(store.fs, store.root, url=store.url, local_root=store.local_root, retry_s=1.0)
    recording.calls = []
    client.app.state.store = recording  # type: ignore[attr-defined]
    other = TRAIN + b"another fine sentence,1\n"

    def upload(key: str, content: bytes) -> tuple[httpx.Response, list[tuple[str, str]]]:
        recording.calls.clear()
        answer = client.post("/v1/files", files={"file": ("train.csv", content)}, headers=as_(key))
        return answer, [(op, key.replace(jobs_sha(content), "<sha>")) for op, key in recording.calls]

    bobs, _ = upload(BOB, TRAIN)
    new, new_ops = upload(ALICE, other)  # bytes nobody has
    known, known_ops = upload(ALICE, TRAIN)  # bytes Bob has

    assert (new.status_code, known.status_code, bobs.status_code) == (201, 201, 201)
    assert sorted(new.json()) == sorted(known.json())
    assert known.json()["id"] != bobs.json()["id"]
    assert new_ops == known_ops and ("put", "files/<sha>") in new_ops
    # The owner's own bytes again: the owner's file, and nothing stored.
    again, again_ops = upload(ALICE, TRAIN)
    assert again.status_code == 200 and again.json()["id"] == known.json()["id"]
    assert not any(op == "put" for op, _ in again_ops)


def jobs_sha(content: bytes) -> str:
    import hashlib

    return hashlib.sha256(content).hexdigest()


@pytest.mark.e2e
@pytest.mark.parametrize("crash_at", ["store_put", "after_store_put"])
def test_an_api_killed_between_the_store_and_the_database_leaves_no_orphan(
    keyed: Settings, tmp_path: Path, crash_at: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CRASH_AT_ENV, crash_at)
    with api_process(keyed, log=tmp_path / "api.log") as (http, process):
        with pytest.raises(httpx.TransportError):  # the process is gone mid-request
            http.post("/v1/files", files={"file": ("train.csv", TRAIN)}, headers=as_(ALICE))
        process.wait(timeout=20)
    left = stored(keyed)
    if crash_at == "store_put" and keyed.storage_url:
        assert left == []  # S3 writes an object whole or not at all
    else:
        assert left, "the crash point was not reached"  # the bytes (or their partial copy) were written
    with Database(keyed.database_url).session() as session:
        assert jobs_repo.list_files(session)[0] == []

    monkeypatch.delenv(CRASH_AT_ENV)
    with api_process(keyed, log=tmp_path / "api2.log") as (http, _process):  # its start sweeps
        assert http.get("/v1/files", headers=as_(ALICE)).json()["data"] == []
        # The sweep runs beside the API's first requests (service/main.store_chores).
        wait_for(lambda: stored(keyed) == [], timeout_s=60)


def test_the_sweep_keeps_young_objects_and_every_object_a_row_holds(keyed: Settings) -> None:
    database = Database(keyed.database_url)
    store = open_store(keyed)
    with TestClient(create_app(keyed), base_url=LOOPBACK_URL) as client:
        kept = client.post("/v1/files", files={"file": ("train.csv", TRAIN)}, headers=as_(ALICE)).json()
    orphan = tmp_orphan(keyed)
    store.put(orphan, file_key("0" * 64))

    assert sweep_orphans(database, store, grace_s=3600.0) == 0  # too young: an upload may be in flight
    assert sweep_orphans(database, store, grace_s=0.0) == 1
    assert stored(keyed) == [kept["sha256"]]


def tmp_orphan(settings: Settings) -> Path:
    path = settings.cache_dir / "orphan.bin"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"nobody's bytes")
    return path
