"""Normal client behaviour is not an error (issue 34 item 5): clients that close a job's stream in the
middle of its replay, and probes of /readyz that give up before the answer, leave no ERROR line and
no traceback in the log of `python -m service` (uvicorn with the connection guard), read from its
own log file. SQLite and Postgres."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from shared import jobs_repo
from shared.core.db import Database
from shared.jobs_repo import MetricRow
from tests.support.dbutil import claimed
from tests.support.e2e import api_process, submit
from tests.support.kit import QUICK_JOB

pytestmark = pytest.mark.e2e

DISCONNECTS = 30
ROWS = 20_000  # a replay of many pages: the client hangs up while the API is still sending


def _hang_up_mid_replay(where: tuple[str, int], path: str) -> int:
    """Open the stream, read its first bytes, then close the socket with unread data (a reset, as a
    closed browser tab or a killed client sends); the bytes received."""
    with socket.create_connection(where, timeout=10) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n".encode())
        received = b""
        while received.count(b"event: metric") < 3:
            chunk = sock.recv(65536)
            assert chunk, f"the stream ended early: {received[-300:]!r}"
            received += chunk
        return len(received)


def _abandon_probe(where: tuple[str, int]) -> None:
    """Send a /readyz request and close at once, before reading its answer."""
    with socket.create_connection(where, timeout=10) as sock:
        sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")


def test_closed_streams_and_abandoned_probes_log_no_error(
    settings_factory: Any, db_url: str, tmp_path: Path
) -> None:
    settings = settings_factory(db_url)
    db = Database(db_url)
    log = tmp_path / "api.log"
    with api_process(settings, log=log) as (client, _process):
        job_id = submit(client, QUICK_JOB)["id"]
        with db.session() as session:
            claim = claimed(session, job_id)
            for first in range(1, ROWS + 1, 2000):  # Postgres takes at most 65,535 parameters a statement
                rows = [
                    MetricRow(step / 100, step, "train", "loss", 1 / step)
                    for step in range(first, first + 2000)
                ]
                jobs_repo.add_metrics(session, job_id=job_id, rows=rows, claim=claim)
        where = (str(client.base_url.host), int(client.base_url.port or 80))
        for _ in range(DISCONNECTS):
            assert _hang_up_mid_replay(where, f"/v1/jobs/{job_id}/stream") > 0
            _abandon_probe(where)
        # The API still answers, and has finished with every hung-up stream before the log is read.
        assert client.get("/readyz").status_code == 200
        assert client.get(f"/v1/jobs/{job_id}").status_code == 200
    db.dispose()
    said = log.read_text(errors="replace")
    assert "Traceback" not in said, said[-3000:]
    assert "ExceptionGroup" not in said and "BrokenPipeError" not in said, said[-3000:]
    errors = [line for line in said.splitlines() if " ERROR " in line or line.startswith("ERROR")]
    assert not errors, said[-3000:]
