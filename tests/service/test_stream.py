"""GET /v1/jobs/{id}/stream while a real worker trains a job: every row arrives once, in order, and a
client that drops the connection and comes back with Last-Event-ID misses nothing and sees nothing
twice. SQLite and Postgres."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

import service.routes.stream as stream_module
from shared import jobs_repo
from shared.core.db import Database
from tests.support.e2e import all_metrics, get, live_api, start_worker, submit
from tests.support.observe_helpers import TINY_SPEC, Sse, observe_settings, read_sse


@pytest.mark.e2e
# One database: the stream's events, keep-alives and resume are the API's, above the database, whose
# reads have their tests on both (tests/service/test_stream_fanout.py streams on both, across an
# outage); a second end-to-end run repeated the same API and worker (issue 36, item 7).
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_job_streams_live_and_resumes_after_a_dropped_connection(
    settings_factory: Any, tmp_path: Path, glue_data: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = observe_settings(settings_factory, tmp_path, glue_data, db_url)
    # Seconds between keep-alive comments, shortened so the test sees them while the job waits.
    monkeypatch.setattr(stream_module, "KEEPALIVE_S", 0.3)
    spec = {**TINY_SPEC, "max_train_samples": 1920, "num_train_epochs": 2, "save_strategy": "epoch"}
    with live_api(settings) as client:
        job = submit(client, spec)
        url = f"/v1/jobs/{job['id']}/stream"

        # Queued, no worker yet: the stream stays open and says so with keep-alive comments.
        comments: list[str] = []
        first: list[Sse] = []
        with client.stream("GET", url, params={"logs": "true"}) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            lines = response.iter_lines()
            while "keep-alive" not in comments:
                line = next(lines)
                if line.startswith(":"):
                    comments.append(line[1:].strip())
        assert comments[0] == f"job {job['id']}"

        worker = start_worker(settings, "--exit-when-idle", log=tmp_path / "worker.log")
        try:
            # First connection: read until training has produced a few rows, then hang up mid-job.
            # (The job's status is read when its first metric row arrives: it was live, not a replay.)
            status_at_first_metric = None
            with client.stream("GET", url, params={"logs": "true"}) as response:
                for message in read_sse(response):
                    first.append(message)
                    if message.event == "metric" and status_at_first_metric is None:
                        status_at_first_metric = get(client, f"/v1/jobs/{job['id']}")["status"]
                    if sum(m.event == "metric" for m in first) == 5:
                        break
            assert status_at_first_metric == "running"
            assert all(m.event != "end" for m in first)

            # Second connection: resume after the last event the first one received.
            second: list[Sse] = []
            with client.stream(
                "GET", url, params={"logs": "true"}, headers={"Last-Event-ID": first[-1].id or ""}
            ) as response:
                second = list(read_sse(response))
            assert worker.wait(120) == 0
        finally:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
                worker.wait(30)

        received = first + second
        final = get(client, f"/v1/jobs/{job['id']}")
        assert final["status"] == "succeeded", final["error"]
        assert second[-1].event == "end" and second[-1].data == {"status": "succeeded"}

        # Metric rows: each one exactly once, in the order written.
        metric_ids = [m.data["id"] for m in received if m.event == "metric"]
        assert metric_ids == [r["id"] for r in all_metrics(client, job["id"])]
        # Events (state changes, checkpoints, log events): each once, in order; a checkpoint
        # travels as its own kind of message but holds its place in the event cursor.
        events = get(client, f"/v1/jobs/{job['id']}/events")["data"]
        streamed = [m for m in received if m.event in ("status", "event", "checkpoint")]
        assert [int((m.id or "").split(".")[1]) for m in streamed] == [e["id"] for e in events]
        statuses = [m.data["status"] for m in received if m.event == "status"]
        assert statuses == ["queued", "running", "succeeded"]
        checkpoints = [m.data for m in received if m.event == "checkpoint"]
        assert [c["step"] for c in checkpoints] == [120, 240]  # 1920 rows / 16 = 120 steps an epoch
        assert checkpoints[-1]["metrics"]["accuracy"] == final["latest_metrics"]["eval"]["accuracy"]
        # The log file, followed across the reconnection: the same bytes the logs endpoint serves.
        streamed_log = "".join(m.data["text"] for m in received if m.event == "log")
        assert streamed_log == client.get(f"/v1/jobs/{job['id']}/logs").text
        assert "training:" in streamed_log
        # Ids are cursors that only grow.
        cursors = [tuple(map(int, m.id.split("."))) for m in received if m.id]
        assert cursors == sorted(cursors)

        # A finished job's stream replays what it has and ends; a bad Last-Event-ID is refused.
        with client.stream("GET", url, headers={"Last-Event-ID": received[-1].id or ""}) as response:
            assert [m.event for m in read_sse(response)] == ["end"]
        refused = client.get(url, headers={"Last-Event-ID": "12;DROP"})
        assert refused.status_code == 422 and refused.json()["error"]["field"] == "Last-Event-ID"


def test_a_stream_poll_is_one_statement_of_two_index_range_scans(db: Database) -> None:
    """However many rows a job has, a stream's poll walks the (job_id, id) indexes of both tables."""
    statement = jobs_repo.stream_statement(job_id=1, after_metric=5, after_event=5, limit=1000)
    sql = str(statement.compile(db.engine, compile_kwargs={"literal_binds": True}))
    with db.engine.connect() as connection:
        if db.dialect == "sqlite":
            plan = " ".join(str(row[-1]) for row in connection.execute(text(f"EXPLAIN QUERY PLAN {sql}")))
            assert "SEARCH job_metrics USING INDEX ix_job_metrics_job_id_id (job_id=? AND id>?)" in plan
            assert "SEARCH job_events USING INDEX ix_job_events_job_id_id (job_id=? AND id>?)" in plan
        else:
            connection.execute(text("SET enable_seqscan = off"))  # an empty table would be scanned otherwise
            plan = " ".join(str(row[0]) for row in connection.execute(text(f"EXPLAIN {sql}")))
            assert "ix_job_metrics_job_id_id" in plan and "ix_job_events_job_id_id" in plan
            assert "Seq Scan" not in plan
