"""Multipart uploads cut mid-part leave no parts in the bucket (issue 34 item 6), against moto's S3
behind the test relay: an upload cut by an outage is aborted by the process that made it once the
store answers again, and one whose process was SIGKILLed is aborted by the API's start-up sweep. The
sweep reads no row, but it runs in the API's start: SQLite and Postgres. (moto dates every multipart
upload 2010-11-10, so the sweep's age rule is not what these tests tell apart.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.main import create_app
from shared.core.storage import PART_BYTES, Store, open_store
from tests.support.e2e import LOOPBACK_URL, REPO
from tests.support.s3_endpoint import S3Endpoint

pytestmark = pytest.mark.e2e

SIZE = 6 * PART_BYTES  # a multipart upload of six parts, sent one at a time


def _open_uploads(store: Store) -> list[dict[str, Any]]:
    bucket, _, prefix = store.root.partition("/")
    page = store.fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=prefix)
    return list(page.get("Uploads", []))


def _wait_for_an_open_upload(store: Store, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not _open_uploads(store):
        assert time.monotonic() < deadline, "no multipart upload began"
        time.sleep(0.02)


def _big_file(path: Path) -> Path:
    path.write_bytes(os.urandom(SIZE))
    return path


def test_an_upload_cut_by_an_outage_is_aborted_by_its_uploader(
    settings_factory: Any,
    sqlite_url: str,
    s3_url: str,
    s3_endpoint: S3Endpoint,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = open_store(settings_factory(sqlite_url, storage_url=s3_url), retry_s=60.0)
    store.check()
    local = _big_file(tmp_path / "model.safetensors")
    failed: list[BaseException] = []

    async def abort_lost(*args: Any, **kwargs: Any) -> None:
        raise ConnectionResetError("the abort was lost to the outage")  # as a request during it is

    # s3fs aborts a multipart upload whose part failed, in one request; one sent while the store is
    # away is lost (here: every one, so the leftover is certain, whatever the relay's timing).
    monkeypatch.setattr(store.fs, "_abort_mpu", abort_lost)

    def upload() -> None:
        try:
            store.put(local, "jobs/1/model.safetensors")
        except BaseException as exc:
            failed.append(exc)

    uploader = threading.Thread(target=upload)
    uploader.start()
    _wait_for_an_open_upload(store)
    s3_endpoint.down()  # mid-part: the part's connection is cut, and so is s3fs's own abort
    time.sleep(2.0)
    s3_endpoint.up()
    uploader.join(120)
    assert not uploader.is_alive() and not failed, failed
    assert store.read("jobs/1/model.safetensors") == local.read_bytes()  # the retry stored it whole
    assert _open_uploads(store) == []  # and the cut try's upload was aborted by the uploader


def test_an_upload_whose_process_was_killed_is_swept_at_the_apis_start(
    settings_factory: Any, db_url: str, s3_url: str, tmp_path: Path
) -> None:
    settings = settings_factory(db_url, storage_url=s3_url, orphan_grace_s=0.0)
    store = open_store(settings)
    store.check()
    local = _big_file(tmp_path / "checkpoint.bin")
    code = (
        "import sys; from pathlib import Path; from shared.core.storage import Store; "
        "from s3fs import S3FileSystem; "
        "Store(S3FileSystem(), sys.argv[1], url='', local_root=None, retry_s=60)"
        ".put(Path(sys.argv[2]), 'jobs/2/checkpoints/checkpoint-4/optimizer.bin')"
    )
    uploader = subprocess.Popen(
        [sys.executable, "-c", code, store.root, str(local)], cwd=REPO, env=os.environ
    )
    try:
        _wait_for_an_open_upload(store)
    finally:
        uploader.send_signal(signal.SIGKILL)
        uploader.wait(30)
    assert len(_open_uploads(store)) == 1  # a killed process aborts nothing

    with TestClient(create_app(settings), base_url=LOOPBACK_URL) as api:
        assert api.get("/healthz").status_code == 200
    assert _open_uploads(store) == []
    assert not store.exists("jobs/2/checkpoints/checkpoint-4/optimizer.bin")
