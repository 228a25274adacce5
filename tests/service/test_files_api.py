"""/v1/files against a real S3 endpoint (moto's server): uploads checked as they land, stored once
by content, owned; and the API's memory while a large upload streams through it."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gluejobs import Client
from service.main import create_app
from shared.core.config import Settings
from shared.core.storage import open_store
from tests.support.e2e import LOOPBACK_URL, api_process, live_api
from tests.support.kit import ALICE, TINY_MODEL

pytestmark = pytest.mark.e2e

BOB = "bob-key-0123456789abcdefgh"
TRAIN = b"sentence,label\n" + b"".join(f"a fine sentence number {i},{i % 2}\n".encode() for i in range(40))


def as_(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def upload(client: TestClient, name: str, content: bytes, key: str = ALICE, **fields: str) -> Any:
    return client.post("/v1/files", files={"file": (name, content)}, data=fields, headers=as_(key))


@pytest.fixture
def keyed(settings_factory: Any, sqlite_url: str, s3_url: str) -> Settings:
    settings: Settings = settings_factory(
        sqlite_url, storage_url=s3_url, api_keys=[ALICE, BOB], max_upload_bytes=64 * 1024
    )
    open_store(settings).check()
    return settings


@pytest.fixture
def client(keyed: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(keyed), base_url=LOOPBACK_URL) as test_client:
        yield test_client


def stored_objects(settings: Settings) -> list[str]:
    return [f.path for f in open_store(settings).list("files")]


def test_the_same_bytes_are_stored_once_and_each_owner_sees_only_their_files(
    client: TestClient, keyed: Settings
) -> None:
    first = upload(client, "train.csv", TRAIN)
    again = upload(client, "train.csv", TRAIN)
    bobs = upload(client, "mine.csv", TRAIN, key=BOB)

    assert first.status_code == 201, first.text
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]  # the same file
    assert bobs.status_code == 201 and bobs.json()["id"] != first.json()["id"]
    assert stored_objects(keyed) == [first.json()["sha256"]]  # one object for the three uploads
    body = first.json()
    assert (body["rows"], body["columns"], body["checks"]["label_counts"]) == (
        40,
        ["sentence", "label"],
        {"0": 20, "1": 20},
    )
    listed = client.get("/v1/files", params={"sha256": body["sha256"]}, headers=as_(BOB)).json()["data"]
    assert [f["id"] for f in listed] == [bobs.json()["id"]]
    content = client.get(f"/v1/files/{body['id']}/content", headers=as_(ALICE))
    assert content.status_code == 200 and content.content == TRAIN

    # Another key cannot read it, use it in a job, or delete it: to Bob it does not exist.
    for method, path in (("GET", ""), ("GET", "/content"), ("DELETE", "")):
        answer = client.request(method, f"/v1/files/{body['id']}{path}", headers=as_(BOB))
        assert answer.status_code == 404, (method, path, answer.text)
    spec = {"model_name_or_path": TINY_MODEL, "train_file": body["id"], "eval_strategy": "no"}
    used = client.post("/v1/jobs", json={"spec": spec}, headers=as_(BOB))
    assert used.status_code == 404 and used.json()["error"]["field"] == "spec.train_file", used.text
    assert client.get("/v1/jobs", headers=as_(BOB)).json()["data"] == []


def test_a_file_a_queued_job_uses_cannot_be_deleted(client: TestClient, keyed: Settings) -> None:
    file = upload(client, "train.csv", TRAIN).json()
    spec = {"model_name_or_path": TINY_MODEL, "train_file": file["id"], "eval_strategy": "no", "seed": 1}
    job = client.post("/v1/jobs", json={"spec": spec}, headers=as_(ALICE))
    assert job.status_code == 201, job.text
    assert job.json()["spec"]["uploaded_files"]["train_file"] == {
        "id": file["id"],
        "filename": "train.csv",
        "bytes": len(TRAIN),
        "sha256": file["sha256"],
    }

    refused = client.delete(f"/v1/files/{file['id']}", headers=as_(ALICE))
    assert refused.status_code == 409 and f"job {job.json()['id']}" in refused.json()["error"]["message"]
    client.post(f"/v1/jobs/{job.json()['id']}/cancel", headers=as_(ALICE))
    deleted = client.delete(f"/v1/files/{file['id']}", headers=as_(ALICE))
    assert deleted.status_code == 200, deleted.text
    assert stored_objects(keyed) == []  # its bytes went with the last file that held them
    assert client.get(f"/v1/files/{file['id']}", headers=as_(ALICE)).status_code == 404
    # The finished job keeps the record of what it was to train on.
    kept = client.get(f"/v1/jobs/{job.json()['id']}", headers=as_(ALICE)).json()
    assert kept["data_files"] == [
        {
            "field": "train_file",
            "file_id": file["id"],
            "filename": "train.csv",
            "bytes": len(TRAIN),
            "sha256": file["sha256"],
        }
    ]


@pytest.mark.parametrize(
    ("name", "content", "fields", "status", "says"),
    [
        ("photo.png", b"\x89PNG\r\n", {}, 422, "is not a data file"),
        ("train.csv", b"\x00\x01\x02 not a table\xff", {}, 422, "codec can't decode byte 0xff"),
        (
            "train.csv",
            b"sentence,score\nfine,1\n",
            {},
            422,
            "has no 'label' column (its columns: sentence, score); map yours with --text_column sentence "
            '--label_column score (spec: "text_column": "sentence", "label_column": "score")',
        ),
        (
            "train.csv",
            b"sentence,label\nfine,1\nbad,7\n",
            {"task_name": "sst2"},
            422,
            "label '7' on row 2 does not fit",
        ),
        ("train.csv", b"", {}, 422, "could not read file 'train.csv'"),
        ("train.csv", b"sentence,label\n" + b"x,1\n" * 20_000, {}, 413, "larger than 65536 bytes"),
    ],
    ids=[
        "not-a-table-format",
        "not-a-table",
        "no-label-column",
        "label-outside-the-task",
        "empty",
        "over-the-limit",
    ],
)
def test_bad_uploads_are_refused_naming_the_problem_and_nothing_is_kept(
    client: TestClient,
    keyed: Settings,
    name: str,
    content: bytes,
    fields: dict[str, str],
    status: int,
    says: str,
) -> None:
    answer = upload(client, name, content, **fields)

    assert answer.status_code == status, answer.text
    assert says in answer.json()["error"]["message"]
    assert client.get("/v1/files", headers=as_(ALICE)).json()["data"] == []
    assert stored_objects(keyed) == []
    assert list((keyed.cache_dir / "uploads").glob("*")) == []


def test_a_dry_run_upload_checks_and_keeps_nothing(client: TestClient, keyed: Settings) -> None:
    answer = client.post(
        "/v1/files",
        params={"dry_run": "true"},
        files={"file": ("t.csv", TRAIN)},
        data={"task_name": "sst2"},
        headers=as_(ALICE),
    )

    assert answer.status_code == 200, answer.text
    assert answer.json()["checks"]["label_counts"] == {"negative": 20, "positive": 20}
    assert client.get("/v1/files", headers=as_(ALICE)).json()["data"] == [] and stored_objects(keyed) == []


def _vm_hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_a_large_upload_streams_through_the_api_and_a_cut_off_one_leaves_nothing(
    settings_factory: Any, sqlite_url: str, s3_url: str, tmp_path: Path
) -> None:
    settings: Settings = settings_factory(sqlite_url, storage_url=s3_url)
    big = tmp_path / "big.csv"
    sentence = "a long sentence of the kind people write in reviews " * 20
    with big.open("w") as out:
        out.write("sentence,label\n")
        row = 0
        while out.tell() < 200 * 1024 * 1024:
            out.write(f"{sentence}{row},{row % 2}\n")
            row += 1
    with api_process(settings, log=tmp_path / "api.log") as (client, process):
        small = client.post("/v1/files", files={"file": ("small.csv", TRAIN)})  # imports and pools warm
        assert small.status_code == 201, small.text
        before = _vm_hwm_kib(process.pid)
        with big.open("rb") as handle:
            answer = client.post("/v1/files", files={"file": ("big.csv", handle)}, timeout=600)
        assert answer.status_code == 201, answer.text
        grown_mib = (_vm_hwm_kib(process.pid) - before) / 1024
        assert answer.json()["rows"] == row and answer.json()["bytes"] == big.stat().st_size
        assert grown_mib < 50, f"the API's peak RSS grew by {grown_mib:.0f} MiB for a 200 MiB upload"

        # An upload cut off midway: no file, no object, nothing on the API's disk.
        with socket.create_connection(("127.0.0.1", client.base_url.port)) as raw:
            head = (
                "POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                "Content-Type: multipart/form-data; boundary=XyZ\r\nContent-Length: 10000000\r\n\r\n"
                '--XyZ\r\nContent-Disposition: form-data; name="file"; filename="cut.csv"\r\n\r\n'
            )
            raw.sendall(head.encode() + b"sentence,label\n" + b"half of it,1\n" * 50_000)
        listed = client.get("/v1/files").json()["data"]
        assert sorted(f["filename"] for f in listed) == ["big.csv", "small.csv"]
        assert len(open_store(settings).list("files")) == 2
        leftovers = list((settings.cache_dir / "uploads").glob("*"))
        for _ in range(20):
            if not leftovers:
                break
            time.sleep(0.25)
            leftovers = list((settings.cache_dir / "uploads").glob("*"))
        assert leftovers == []


def test_presigned_downloads_redirect_to_the_store_and_the_client_follows(
    settings_factory: Any, sqlite_url: str, s3_url: str, s3_endpoint: Any, tmp_path: Path
) -> None:
    settings: Settings = settings_factory(sqlite_url, storage_url=s3_url, storage_presign_s=60)
    open_store(settings).check()
    with live_api(settings) as http:
        file = http.post("/v1/files", files={"file": ("train.csv", TRAIN)}).json()
        answer = http.get(f"/v1/files/{file['id']}/content")
        assert answer.status_code == 307
        assert answer.headers["location"].startswith(f"{s3_endpoint.url}/")  # the store itself
        with Client(str(http.base_url)) as client:
            assert client.files.download(file["id"], tmp_path / "back.csv").read_bytes() == TRAIN
