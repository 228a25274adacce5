"""A job read through its pages first (/metrics, /events, /logs?tail=, as the dashboard reads it), then
followed from where those reads ended: the stream, started with the id built from them, sends exactly
what was written after them. A progress bar's log goes out as it is redrawn (pieces end at carriage
returns too), and its tail is the last lines however few newlines it has. Rows written as a job's
process writes them (claimed, fenced)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.files.job_folders import LocalFolder, new_log_pieces, read_log
from shared import jobs_repo
from shared.core.db import Database
from shared.core.tables import JobStatus
from shared.jobs_repo import MetricRow
from tests.support.dbutil import claimed
from tests.support.e2e import get, live_api, submit
from tests.support.kit import QUICK_JOB
from tests.support.observe_helpers import read_sse


def test_a_progress_bars_log_is_tailed_by_its_redrawn_lines_and_says_where_it_ends(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    # Fifty thousand redraws of one bar and a newline now and then (as tqdm writes to a file).
    bar = b"".join(b"\rMap: %5d/50000" % n + (b"\n" if n % 20_000 == 0 else b"") for n in range(50_000))
    (logs / "attempt-2.log").write_bytes(b"start\n" + bar)
    attempt, text, end = read_log(LocalFolder(tmp_path), job_id=1, attempt=None, tail=3)
    whole = b"start\n" + bar
    assert (attempt, text, end) == (2, b"".join(whole.splitlines(keepends=True)[-3:]), len(whole))
    assert text == b"Map: 49997/50000\rMap: 49998/50000\rMap: 49999/50000"
    assert read_log(LocalFolder(tmp_path), job_id=1, attempt=None, tail=None) == (2, whole, len(whole))
    assert read_log(LocalFolder(tmp_path / "none"), job_id=1, attempt=None, tail=3) == (None, b"", 0)


def test_the_stream_sends_a_progress_bar_as_it_is_redrawn(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "attempt-1.log"
    log.write_bytes(b"loading\nMap:  10%\rMap:  20%\rMap:  3")
    pieces = new_log_pieces(LocalFolder(tmp_path), attempt=1, offset=0, flush=False)
    # Up to the last redraw; the half-written one waits for its end.
    assert [(p.attempt, p.text) for p in pieces] == [(1, "loading\nMap:  10%\rMap:  20%\r")]
    assert new_log_pieces(LocalFolder(tmp_path), attempt=1, offset=pieces[-1].offset, flush=False) == []
    with log.open("ab") as handle:
        handle.write(b"0%\n")
    assert [
        p.text
        for p in new_log_pieces(LocalFolder(tmp_path), attempt=1, offset=pieces[-1].offset, flush=False)
    ] == ["Map:  30%\n"]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_stream_started_where_the_pages_ended_sends_exactly_what_came_after(
    settings_factory: Any, db_url: str
) -> None:
    settings = settings_factory(db_url)
    db = Database(db_url)
    with live_api(settings) as client:
        job_id = submit(client, QUICK_JOB)["id"]
        with db.session() as session:
            claim = claimed(session, job_id)
        log = settings.job_dir(job_id) / "logs" / f"attempt-{claim.attempt}.log"
        log.parent.mkdir(parents=True)

        def report(step: int, line: bytes) -> None:
            with db.session() as session:
                jobs_repo.add_metrics(
                    session,
                    job_id=job_id,
                    rows=[MetricRow(0.1 * step, step, "train", "loss", 1 / step)],
                    claim=claim,
                )
                jobs_repo.add_event(
                    session, job_id=job_id, message=f"step {step}", claim=claim, dedup_key=str(step)
                )
            with log.open("ab") as handle:
                handle.write(line)

        report(1, b"one\n")
        report(2, b"two\r")
        # The page's reads: every row so far, and the log's tail with where it ends.
        metrics = get(client, f"/v1/jobs/{job_id}/metrics")["data"]
        events = get(client, f"/v1/jobs/{job_id}/events")["data"]
        tail = client.get(f"/v1/jobs/{job_id}/logs", params={"tail": 1})
        assert tail.text == "two\r"
        assert tail.headers["X-Gluejobs-Log-Offset"] == str(len(b"one\ntwo\r"))
        log_at = f"{tail.headers['X-Gluejobs-Attempt']}.{tail.headers['X-Gluejobs-Log-Offset']}"
        resume = f"{metrics[-1]['id']}.{events[-1]['id']}.{log_at}"

        report(3, b"three\n")
        with db.session() as session:
            assert jobs_repo.finish_job(session, claim=claim, status=JobStatus.succeeded)
        with client.stream(
            "GET", f"/v1/jobs/{job_id}/stream", params={"logs": "true"}, headers={"Last-Event-ID": resume}
        ) as response:
            received = list(read_sse(response))
    db.dispose()
    assert [m.data["step"] for m in received if m.event == "metric"] == [3]
    assert [m.data["message"] for m in received if m.event == "event"] == ["step 3"]
    assert [m.data["status"] for m in received if m.event == "status"] == ["succeeded"]
    assert "".join(m.data["text"] for m in received if m.event == "log") == "three\n"
    assert received[-1].event == "end"
