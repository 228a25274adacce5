"""Nothing lost when a worker dies during a database outage; a worker says when it cannot reach its
database; a warm-start template dies with its worker (issue 13). Real worker processes, real
signals, the real Postgres (refusing connections) and real SQLite files (write lock held past the
busy timeout).

No test here cleans up a job or template process itself: a leftover would be the bug.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from shared import jobs_repo
from shared.core.config import Settings
from shared.core.db import Database, read
from shared.core.tables import Job, utcnow
from tests.support.e2e import (
    all_metrics,
    free_port,
    get,
    live_api,
    run_worker_until_idle,
    start_worker,
    steps_of,
    submit,
    wait_for,
)
from tests.support.kit import POSTGRES_URL
from tests.support.outages import DatabaseOutage

pytestmark = pytest.mark.e2e

# 240 rows / batch 16 = 15 steps an epoch, 2 epochs: 30 steps. Training rows every 4 steps and at
# each epoch's end; an evaluation and a checkpoint every 10 steps.
SPEC = {
    "model_name_or_path": "tiny-bert",
    "task_name": "sst2",
    "max_train_samples": 240,
    "max_eval_samples": 128,
    "per_device_train_batch_size": 16,
    "per_device_eval_batch_size": 32,
    "learning_rate": 1e-3,
    "num_train_epochs": 2,
    "logging_steps": 4,
    "eval_strategy": "steps",
    "eval_steps": 10,
    "save_strategy": "steps",
    "save_steps": 10,
    "seed": 13,
}
TRAIN_ROW_STEPS = [4, 8, 12, 15, 16, 20, 24, 28, 30]  # 15 and 30: the epochs' ends
EVAL_STEPS = [10, 20, 30]
# Trains until it is stopped.
LONG = {
    **SPEC,
    "max_train_samples": 4000,
    "num_train_epochs": 50,
    "eval_strategy": "no",
    "save_strategy": "no",
}
FORKED = re.compile(r"warm start: job process (\d+) forked from template (\d+)")


def _settings(settings_factory: Any, db_url: str, **overrides: Any) -> Settings:
    # SQLite: a busy timeout of 1 s, so that a held write lock is an outage within a heartbeat.
    url = f"{db_url}?timeout=1" if db_url.startswith("sqlite") else db_url
    settings: Settings = settings_factory(url, **overrides)
    return settings


def job_processes(worker_pid: int) -> list[psutil.Process]:
    """The worker's job processes: its descendants that lead a session of their own."""
    return [p for p in psutil.Process(worker_pid).children(recursive=True) if os.getsid(p.pid) == p.pid]


def running(pid: int) -> bool:
    """Whether the process exists and is not a zombie (an orphan's new parent may reap it late)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone_within(pid: int, seconds: float) -> float | None:
    """How long `pid` took to be gone, or None if it was still running after `seconds`."""
    started = time.monotonic()
    while running(pid):
        if time.monotonic() - started > seconds:
            return None
        time.sleep(0.02)
    return time.monotonic() - started


def declared_steps(db: Database, job_id: int) -> list[int]:
    with db.session() as session:
        return [c.step for c in jobs_repo.list_checkpoints(session, job_id=job_id)]


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
def test_a_worker_killed_during_an_outage_between_a_checkpoint_and_its_declaration_loses_no_row(
    settings_factory: Any, db_url: str, tmp_path: Path
) -> None:
    # A lease that outlasts the outage before the kill: the first worker must not give the job up
    # itself (it would stop the job's process at the end of a lease without a heartbeat). Steps
    # 11-20, an evaluation and a checkpoint run inside it, so it allows for a loaded machine (10 s
    # was too short when the suite shared two cores with other work).
    settings = _settings(settings_factory, db_url, lease_s=30.0, heartbeat_s=0.5, retry_backoff_s=0.0)
    db = Database(settings.database_url)
    outage = DatabaseOutage(db_url, POSTGRES_URL)
    checkpoints_dir = settings.job_dir(1) / "checkpoints"
    try:
        with live_api(settings) as client:
            job = submit(client, SPEC)
            assert job["id"] == 1
            first = start_worker(settings, log=tmp_path / "first.log")
            (child,) = wait_for(lambda: job_processes(first.pid), timeout_s=180, interval_s=0.05)

            # Deterministic: freeze the job's process the moment checkpoint 10 is declared (with
            # every row before it), close the database, and let it train on: it logs steps 11-20
            # into its reporter's memory, evaluates at 20, publishes checkpoint-20 and waits to
            # declare it. Then the worker is SIGKILLed.
            wait_for(lambda: declared_steps(db, 1), timeout_s=180, interval_s=0.01)
            child.suspend()
            assert declared_steps(db, 1) == [10], "the job passed its next checkpoint before it was frozen"
            assert not (checkpoints_dir / "checkpoint-20").exists()
            outage.begin()
            child.resume()
            wait_for(lambda: (checkpoints_dir / "checkpoint-20" / "gluejobs_state.json").is_file(), 180, 0.05)
            time.sleep(1.0)  # waiting to declare it: the database refuses every write
            assert child.is_running(), "the job's process ended while the database was away"
            os.kill(first.pid, signal.SIGKILL)  # the worker only: not its process group, not the job
            first.wait(10)
            assert gone_within(child.pid, 5) is not None, "the orphaned job process kept running"
            assert (checkpoints_dir / "checkpoint-20").is_dir()  # published, never declared
            outage.end()

            # Until the dead worker's lease has run out (it did not renew it since the outage began):
            # the job's own deadline, not a whole lease from now.
            with db.session() as session, read(session):
                expires = session.get(Job, 1).lease_expires_at  # type: ignore[union-attr]
            assert expires is not None
            time.sleep(max(0.0, (expires - utcnow()).total_seconds()) + 0.5)
            run_worker_until_idle(settings, tmp_path / "second.log")

            final = get(client, "/v1/jobs/1")
            assert final["status"] == "succeeded", final["error"]
            assert final["attempts"] == 2
            rows = all_metrics(client, 1)
            for name in ("loss", "learning_rate"):
                assert steps_of(rows, "train", name) == TRAIN_ROW_STEPS, name
            assert steps_of(rows, "eval", "accuracy") == EVAL_STEPS
            messages = [e["message"] for e in get(client, "/v1/jobs/1/events", limit=1000)["data"]]
            assert any(m.startswith("resumed from checkpoint-10 at step 10") for m in messages), messages
            assert any("no attempt declared: checkpoint-20" in m for m in messages), messages
            listed = [c["step"] for c in get(client, "/v1/jobs/1/checkpoints")["data"]]
        assert listed == [10, 20, 30]
        assert sorted(p.name for p in checkpoints_dir.iterdir()) == [f"checkpoint-{s}" for s in listed]
    finally:
        outage.close()
        db.dispose()


def _health(port: int) -> Callable[[], httpx.Response | None]:
    def readyz() -> httpx.Response | None:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
        except httpx.TransportError:
            return None

    return readyz


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
def test_a_busy_workers_readyz_follows_the_database_within_a_heartbeat(
    settings_factory: Any, db_url: str, tmp_path: Path
) -> None:
    # A long lease: the busy worker's loop writes its own heartbeat only every lease/4 (15 s); the
    # job's heartbeat (every second) is what must tell.
    settings = _settings(settings_factory, db_url, lease_s=60.0, heartbeat_s=1.0)
    port = free_port()
    readyz = _health(port)
    outage = DatabaseOutage(db_url, POSTGRES_URL)
    worker = start_worker(
        settings, "--health-port", str(port), "--health-host", "127.0.0.1", log=tmp_path / "w.log"
    )
    try:
        with live_api(settings) as client:
            job = submit(client, LONG)
            wait_for(lambda: len(all_metrics(client, job["id"])) >= 3, timeout_s=180, interval_s=0.1)
        ready = readyz()
        assert ready is not None and ready.status_code == 200 and ready.json()["jobs"] == [job["id"]]

        outage.begin()
        began = time.monotonic()
        waiting = wait_for(lambda: (r := readyz()) is not None and r.status_code == 503 and r, 30, 0.05)
        took = time.monotonic() - began
        assert waiting.json()["status"] == "database_unreachable" and waiting.json()["jobs"] == [job["id"]]
        # One heartbeat, plus the failing round trip itself (SQLite: its 1 s busy timeout) and this
        # poll's own latency on a loaded machine.
        assert took <= settings.heartbeat_s + 1.0 + 1.5, f"503 only after {took:.1f}s"

        outage.end()
        ended = time.monotonic()
        wait_for(lambda: (r := readyz()) is not None and r.status_code == 200, 30, 0.05)
        assert time.monotonic() - ended <= settings.heartbeat_s + 1.5
        assert worker.poll() is None
    finally:
        outage.close()
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(60) == 0


def _template_of(worker_pid: int) -> psutil.Process | None:
    for child in psutil.Process(worker_pid).children():
        if "multiprocessing.forkserver" in " ".join(child.cmdline()):
            return child
    return None


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_template_is_gone_within_two_seconds_of_its_workers_sigkill(
    settings_factory: Any, db_url: str, tmp_path: Path
) -> None:
    settings: Settings = settings_factory(db_url, device_lock_dir=tmp_path / "locks")
    # While it imports torch and the rest (the worker claims nothing before that is done).
    worker = start_worker(settings, log=tmp_path / "importing.log")
    template = wait_for(lambda: _template_of(worker.pid), timeout_s=60, interval_s=0.02)
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(10)
    took = gone_within(template.pid, 2.0)
    assert took is not None, "the template outlived its worker by more than 2 s while importing"

    # Ready, and forking: a job runs from it.
    with live_api(settings) as client:
        job = submit(client, LONG)
        worker = start_worker(settings, log=tmp_path / "forking.log")
        log = settings.job_dir(job["id"]) / "logs" / "attempt-1.log"
        forked = wait_for(lambda: log.is_file() and FORKED.search(log.read_text()), timeout_s=180)
        child, template_pid = int(forked[1]), int(forked[2])
        wait_for(lambda: all_metrics(client, job["id"]), timeout_s=180, interval_s=0.1)
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(10)
    assert gone_within(template_pid, 2.0) is not None, "the template outlived its worker by more than 2 s"
    assert gone_within(child, 2.0) is not None, "the job's process outlived its worker by more than 2 s"
