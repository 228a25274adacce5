"""What /readyz tells while a worker warms up, and what a worker logs while it idles (issue 35 item 4).

A worker's /readyz said {"database_reachable": false, "status": "waiting"} for the whole warm-start
template load while its database answered, and its release check logged two alembic INFO lines every
poll. Real worker processes with their real template, the real Postgres (refusing connections) and
real SQLite files.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.core.db import Database
from tests.support.e2e import free_port, start_worker, wait_for
from tests.support.kit import POSTGRES_URL
from tests.support.outages import DatabaseOutage
from worker.fleet.health import DatabaseWatch, readiness

TEMPLATE = "the warm-start template"


def _readyz(port: int) -> httpx.Response | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
    except httpx.TransportError:
        return None


def _warming(port: int) -> httpx.Response | None:
    """The answer while the worker waits for its warm-start template, once it says so."""
    response = _readyz(port)
    return response if response is not None and response.json().get("warming_up") == TEMPLATE else None


def _status(response: httpx.Response | None) -> str | None:
    return None if response is None else str(response.json()["status"])


@pytest.mark.e2e
@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
def test_a_warming_worker_says_warming_up_with_its_database_reachable_then_idles_quietly(
    settings_factory: Any, db_url: str, tmp_path: Path
) -> None:
    settings = settings_factory(db_url, heartbeat_s=0.5, poll_interval_s=0.5, lease_s=10.0)
    port, log = free_port(), tmp_path / "worker.log"
    worker = start_worker(settings, "--health-port", str(port), "--health-host", "127.0.0.1", log=log)
    try:
        # The template imports torch and transformers: seconds, during which the worker says so.
        warming = wait_for(
            lambda: (r := _readyz(port)) is not None and r.json().get("warming_up") == TEMPLATE and r
        )
        assert warming.status_code == 503 and warming.headers["content-type"] == "application/json"
        assert warming.json()["status"] == "warming_up" and warming.json()["database_reachable"] is True
        seen = set()

        def ready() -> bool:
            response = _readyz(port)
            seen.add(_status(response))
            return response is not None and response.status_code == 200

        wait_for(ready, timeout_s=300, interval_s=0.05)
        assert seen <= {"warming_up", "ok"}  # never `database_unreachable`: no round trip failed
        assert "warm-start template ready" in log.read_text()

        # Idle over several heartbeats and polls: every claim asks whether the release still fits
        # the database, and none of that is news worth an INFO line. (From the loop's start line on,
        # which it may write just after its /readyz turned 200.)
        wait_for(lambda: " started on " in log.read_text(), timeout_s=30, interval_s=0.05)
        said = log.stat().st_size
        time.sleep(8 * settings.heartbeat_s)
        assert worker.poll() is None
        with log.open() as file:
            file.seek(said)
            lines = file.read().splitlines()
        assert not [line for line in lines if " INFO " in line or "alembic" in line], lines
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(60) == 0


@pytest.mark.e2e
@pytest.mark.postgres
def test_a_warming_workers_readyz_says_database_unreachable_only_once_a_round_trip_failed(
    settings_factory: Any, postgres_url: str, tmp_path: Path
) -> None:
    settings = settings_factory(postgres_url, poll_interval_s=0.5)
    port = free_port()
    outage = DatabaseOutage(postgres_url, POSTGRES_URL)
    worker = start_worker(
        settings, "--health-port", str(port), "--health-host", "127.0.0.1", log=tmp_path / "worker.log"
    )
    try:
        warming = wait_for(
            lambda: (r := _readyz(port)) is not None and r.json().get("warming_up") == TEMPLATE and r
        )
        assert warming.json()["database_reachable"] is True
        outage.begin()
        # The template's wait asks the database every poll interval (the loop, once it claims).
        away = wait_for(lambda: _status(r := _readyz(port)) == "database_unreachable" and r, 30, 0.05)
        assert away.status_code == 503 and away.json()["database_reachable"] is False
        outage.end()
        back = wait_for(lambda: _status(r := _readyz(port)) in {"warming_up", "ok"} and r, 30, 0.05)
        assert back.json()["database_reachable"] is True
        wait_for(lambda: _status(_readyz(port)) == "ok", timeout_s=300, interval_s=0.1)
        assert worker.poll() is None
    finally:
        outage.close()
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(60) == 0


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
def test_readiness_words_follow_the_last_round_trip_and_what_still_warms(db_url: str) -> None:
    watch = DatabaseWatch(Database(db_url))
    body = {"worker_id": "w"}

    def answer(warming: str | None = None) -> dict[str, Any]:
        return readiness({**body, "database_reachable": watch.reachable}, watch, warming)

    # No round trip yet: warming up, not unreachable (nothing failed).
    assert answer()["status"] == "warming_up" and not watch.unreachable
    assert watch.probe()
    assert answer() == {**body, "database_reachable": True, "status": "ok"}
    assert answer(TEMPLATE) == {
        **body,
        "database_reachable": True,
        "status": "warming_up",
        "warming_up": TEMPLATE,
    }
    if db_url.startswith("postgresql"):  # an SQLite file answers reads through any outage
        outage = DatabaseOutage(db_url, POSTGRES_URL)
        try:
            with outage.during():
                assert not watch.probe()
                # The database's word comes first, warming or not.
                assert answer(TEMPLATE)["status"] == "database_unreachable"
            assert watch.probe() and answer()["status"] == "ok"
        finally:
            outage.close()
    watch.db.dispose()


def test_a_probe_that_gives_up_before_its_answer_is_one_info_line_not_a_traceback(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A load balancer's probe that times out closes its socket before the answer: the worker's
    health port logs one INFO line, and socketserver's traceback never reaches stderr (issue 34)."""
    import socket
    import struct
    import threading

    from worker.fleet.health import HealthServer

    answered = threading.Event()

    def slow_status() -> dict[str, Any]:
        answered.wait(0.2)  # the probe is gone by the time the answer is written
        return {"state": "idle"}

    server = HealthServer(0, slow_status, host="127.0.0.1").start()
    caplog.set_level("INFO", logger="worker.fleet.health")
    try:
        for _ in range(10):
            with socket.create_connection(("127.0.0.1", server.port)) as probe:
                probe.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
                # SO_LINGER 0: the close is a reset, so the server's write fails as a real timeout's does
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        wait_for(lambda: sum("left before its answer" in r.getMessage() for r in caplog.records) >= 10, 10)
        assert httpx.get(f"http://127.0.0.1:{server.port}/healthz").status_code == 200
    finally:
        server.stop()
    left = [r for r in caplog.records if "left before its answer" in r.getMessage()]
    assert {r.levelname for r in left} == {"INFO"} and not any(r.exc_info for r in left)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "BrokenPipeError" not in err and "ConnectionResetError" not in err, err
