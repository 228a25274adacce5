"""Checkpoint folders against what the database declared (worker/training/checkpoints.py), the worker's record
of its last database round trip (worker/fleet/health.py DatabaseWatch) and a liveness watch that can be
stopped (worker/fleet/liveness.py): real folders, a real SQLite file, real threads."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from pathlib import Path

import pytest
from sqlalchemy import make_url
from sqlalchemy.exc import OperationalError

from shared import jobs_repo
from shared.core.db import Database
from shared.core.errors import NotFound
from shared.core.tables import ErrorCode
from tests.support.dbutil import claimed
from worker.fleet.health import DatabaseWatch
from worker.fleet.liveness import watch_worker
from worker.fleet.outcome import classify
from worker.training import checkpoints


def _checkpoint(folder: Path, step: int, *, complete: bool = True, name: str | None = None) -> Path:
    path = folder / (name or f"checkpoint-{step}")
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"weights")
    if complete:
        checkpoints.TrainingState(completed_steps=step, epoch=step / 10).write(path)
    return path


def test_a_new_attempt_resumes_from_the_newest_declared_checkpoint_and_removes_the_rest(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "checkpoints"
    for step in (5, 10):
        _checkpoint(folder, step)  # declared
    _checkpoint(folder, 15)  # published, never declared (its process was killed while waiting)
    _checkpoint(folder, 20, complete=False)  # declared, but its folder is half gone
    _checkpoint(folder, 25, complete=False, name="checkpoint-25.attempt-1.partial")  # being written
    declared = [5, 10, 20, 30]  # 30: declared, its folder rotated away before the deletion was recorded

    read_only = checkpoints.reconcile(folder, declared, remove=False)  # what another rank sees
    assert read_only.resume_from == folder / "checkpoint-10"
    assert len(list(folder.iterdir())) == 5

    found = checkpoints.reconcile(folder, declared)
    assert found.resume_from == folder / "checkpoint-10"
    assert found.removed == ["checkpoint-15", "checkpoint-20", "checkpoint-25.attempt-1.partial"]
    assert found.forgotten == [20, 30]
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoint-10", "checkpoint-5"]
    assert (
        json.loads((folder / "checkpoint-10" / checkpoints.STATE_FILE).read_text())["completed_steps"] == 10
    )


def test_nothing_declared_means_a_fresh_start_and_an_empty_folder(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    _checkpoint(folder, 10)
    found = checkpoints.reconcile(folder, [])
    assert found.resume_from is None and found.removed == ["checkpoint-10"] and found.forgotten == []
    assert list(folder.iterdir()) == []
    assert checkpoints.reconcile(tmp_path / "never-made", []).resume_from is None


def test_staging_is_the_attempts_own_and_publishing_never_replaces_a_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "checkpoints"
    final = folder / "checkpoint-10"
    monkeypatch.setenv(checkpoints.ATTEMPT_ENV, "3")
    staging = checkpoints.staging_path(final)
    assert staging.name == "checkpoint-10.attempt-3.partial"
    _checkpoint(folder, 10, name=staging.name)
    checkpoints.publish(staging, final)
    assert checkpoints.saved_steps(folder) == [10] and not staging.exists()

    # Another attempt (one that lost its lease) publishing the same step: refused, nothing replaced.
    monkeypatch.setenv(checkpoints.ATTEMPT_ENV, "2")
    other = checkpoints.staging_path(final)
    _checkpoint(folder, 10, name=other.name)
    (other / "model.safetensors").write_bytes(b"the other attempt's weights")
    with pytest.raises(checkpoints.CheckpointConflict) as conflict:
        checkpoints.publish(other, final)
    assert (final / "model.safetensors").read_bytes() == b"weights"
    assert not other.exists()
    assert classify(conflict.value) == ErrorCode.worker_lost and ErrorCode.worker_lost.retryable


def test_an_attempt_removes_only_its_own_staging_folders(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    mine = _checkpoint(folder, 20, complete=False, name="checkpoint-20.attempt-2.partial")
    theirs = _checkpoint(folder, 20, complete=False, name="checkpoint-20.attempt-3.partial")
    declared = _checkpoint(folder, 10)
    checkpoints.remove_staging(folder, attempt=2)
    assert not mine.exists() and theirs.exists() and declared.exists()
    checkpoints.remove_staging(folder)
    assert not theirs.exists() and declared.exists()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_database_watch_tells_whether_the_last_round_trip_reached_the_database(db_url: str) -> None:
    watch = DatabaseWatch(Database(f"{db_url}?timeout=0.2"))
    assert not watch.reachable  # nothing has told yet
    with watch.session() as session:
        job = jobs_repo.create_job(session, spec={"model_name_or_path": "m", "task_name": "sst2"})
        claim = claimed(session, job.id)
    assert watch.reachable

    holder = sqlite3.connect(str(make_url(db_url).database), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the write lock, held past the busy timeout
    try:
        with pytest.raises(OperationalError, match="locked"), watch.session() as session:
            jobs_repo.add_event(session, job_id=job.id, message="waits for the lock", claim=claim)
        assert not watch.reachable
    finally:
        holder.execute("ROLLBACK")
        holder.close()

    # An error the database itself answered with is a round trip that reached it.
    with pytest.raises(NotFound), watch.session() as session:
        jobs_repo.get_job(session, job_id=job.id + 1)
    assert watch.reachable
    watch.db.dispose()


def test_a_stopped_liveness_watch_leaves_one_thread(tmp_path: Path) -> None:
    before = threading.active_count()
    watch = watch_worker(os.getpid(), parent_death_signal=False)
    assert watch is not None and watch.thread.is_alive()
    assert threading.active_count() == before + 1
    watch.stop()
    assert not watch.thread.is_alive() and threading.active_count() == before
