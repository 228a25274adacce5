"""The API's reads of the object store while a worker re-uploads what it reads, and while the store is
away (issue 34 item 3): GET /logs (whole and tailed) and the stream's log events answer 200 with a
prefix of the log, or 503 `storage_unavailable` with Retry-After while the store is away, never 500.
Against moto's S3 behind the test relay, on SQLite and Postgres."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.files.job_folders import StoredFolder, new_log_pieces
from service.main import create_app
from shared.core.storage import open_store
from shared.wire.job_folder import job_key
from tests.support.dbutil import claimed
from tests.support.e2e import LOOPBACK_URL
from tests.support.kit import QUICK_JOB
from tests.support.s3_endpoint import S3Endpoint

pytestmark = pytest.mark.e2e

LINE = b"step %06d: loss 0.123456789 " + b"x" * 60 + b"\n"
UPLOADS = 150
OUTAGE_MAX_S = 15.0


def _growing_log(path: Path, stop: threading.Event, uploaded: list[int], settings: Any, key: str) -> None:
    """What a running job's worker does: append to the log, re-upload it whole, again and again."""
    store = open_store(settings, retry_s=30.0)
    step = 0
    while not stop.is_set() and len(uploaded) < UPLOADS:
        with path.open("ab") as handle:
            for _ in range(200):
                step += 1
                handle.write(LINE % step)
        store.put(path, key)
        uploaded.append(path.stat().st_size)


def test_log_reads_racing_reuploads_and_an_outage_answer_200_or_503(
    settings_factory: Any, db_url: str, s3_url: str, s3_endpoint: S3Endpoint, tmp_path: Path
) -> None:
    settings = settings_factory(db_url, storage_url=s3_url, storage_retry_s=1.0)
    local_log = tmp_path / "attempt-1.log"
    answers: Counter[int] = Counter()
    with TestClient(create_app(settings), base_url=LOOPBACK_URL, raise_server_exceptions=False) as api:
        job_id = api.post("/v1/jobs", json={"spec": QUICK_JOB}).json()["id"]
        app_db = api.app.state.db  # type: ignore[attr-defined]
        with app_db.session() as session:
            claimed(session, job_id)
        key = job_key(job_id, "logs/attempt-1.log")
        stop, uploaded = threading.Event(), list[int]()
        writer = threading.Thread(target=_growing_log, args=(local_log, stop, uploaded, settings, key))
        writer.start()
        try:
            while not uploaded:
                time.sleep(0.05)
            # The store away once while the reads go on: taken down from this loop after a few uploads
            # (timers from the first upload once fired after the writer had ended, on a loaded machine,
            # and no read met the outage), and back once a read has met it (a fixed 3 s outage was
            # once spent whole inside one read's retries, on a loaded machine: no read answered 503)
            # or after OUTAGE_MAX_S, well inside the writer's 30 s of retries.
            outage_since: float | None = None
            while writer.is_alive():
                if outage_since is None and len(uploaded) >= 3:
                    s3_endpoint.down()
                    outage_since = time.monotonic()
                elif outage_since is not None and (
                    answers[503] or time.monotonic() - outage_since > OUTAGE_MAX_S
                ):
                    s3_endpoint.up()
                for params in ({}, {"tail": 3}):
                    answer = api.get(f"/v1/jobs/{job_id}/logs", params=params)
                    answers[answer.status_code] += 1
                    if answer.status_code == 503:
                        assert answer.json()["error"]["code"] == "storage_unavailable"
                        assert int(answer.headers["Retry-After"]) > 0
                        continue
                    assert answer.status_code == 200, answer.text
                    text = answer.content
                    assert text.endswith(b"\n") and text.startswith(b"step 0" if not params else b"step")
                    end = int(answer.headers["X-Gluejobs-Log-Offset"])
                    if not params:
                        # One upload, whole (the reader may see an upload before the writer counts it).
                        assert len(text) == end and end % (200 * len(LINE % 1)) == 0
        finally:
            stop.set()
            writer.join(60)
            s3_endpoint.up()
    assert answers[200] > 20, answers
    assert answers[503] >= 1, answers  # the outage was seen, and answered as such
    assert set(answers) <= {200, 503}, answers


def test_a_log_read_from_where_it_ends_is_empty_not_an_error(
    settings_factory: Any, db_url: str, s3_url: str, tmp_path: Path
) -> None:
    """The stream's poll reads from the offset it has reached: at the log's end a range past the
    object (S3's 416) is nothing new, not a failure."""
    settings = settings_factory(db_url, storage_url=s3_url)
    store = open_store(settings)
    store.check()
    log = tmp_path / "attempt-1.log"
    log.write_bytes(b"one\ntwo\n")
    store.put(log, job_key(7, "logs/attempt-1.log"))
    folder = StoredFolder(store, job_key(7))
    [piece] = new_log_pieces(folder, attempt=1, offset=0, flush=False)
    assert (piece.offset, piece.text) == (8, "one\ntwo\n")
    assert new_log_pieces(folder, attempt=1, offset=8, flush=False) == []
    assert new_log_pieces(folder, attempt=1, offset=8, flush=True) == []
