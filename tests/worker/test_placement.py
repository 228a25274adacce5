"""GPU placement and concurrent jobs: a worker runs as many jobs at once as its devices allow.

Real worker processes, real lock files, real SQLite and Postgres, real tiny jobs on GLUE rows. No
GPU here, so GPUs are named with --devices / CUDA_VISIBLE_DEVICES: what is tested is the placement
(locks, claims, CUDA_VISIBLE_DEVICES of each child), which needs no CUDA.
"""

from __future__ import annotations

import os
import signal
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from shared import jobs_repo
from shared.core.config import Settings
from shared.core.db import Database, read
from shared.core.tables import Job, JobEvent, JobStatus
from shared.core.tables import Worker as WorkerRow
from tests.support.e2e import start_worker, wait_for
from tests.support.kit import QUICK_JOB
from worker.fleet.devices import (
    DeviceError,
    DeviceLocks,
    cpu_slots,
    cpu_threads,
    parse_devices,
    resolve_devices,
    visible_gpus,
)

TINY_JOB = {**QUICK_JOB, "seed": 3}


# --- which devices ------------------------------------------------------------------------------


def test_devices_from_the_command_line_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_devices("0,2, 3") == ["0", "2", "3"]
    assert parse_devices("cpu") == ["cpu"]
    with pytest.raises(DeviceError, match="'x' is not a CUDA device"):
        parse_devices("0,x")
    with pytest.raises(DeviceError, match="names 1 more than once"):
        parse_devices("1,1")
    assert resolve_devices("cpu", 3) == ["cpu0", "cpu1", "cpu2"]
    assert resolve_devices(None, 2) == ["cpu0", "cpu1"]
    with pytest.raises(DeviceError, match="--slots is for the CPU"):
        resolve_devices("0,1", 2)
    with pytest.raises(DeviceError, match="at least 1"):
        resolve_devices("cpu", 0)

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,GPU-8a1b2c3d,-1,4")
    assert visible_gpus() == ["2", "GPU-8a1b2c3d"]  # CUDA stops at the first entry it cannot use
    assert resolve_devices(None, None) == ["2", "GPU-8a1b2c3d"]
    assert resolve_devices("2", None) == ["2"]
    with pytest.raises(DeviceError, match=r"--devices 0,4: not among this machine's visible GPUs \(2,GPU-"):
        resolve_devices("0,2,4", None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert resolve_devices(None, None) == ["cpu0"]  # no GPU: one CPU slot


def test_jobs_on_cpu_slots_share_the_cores_one_process_a_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each process of a job on CPU slots gets the cores divided by the worker's slots (torch would
    start a thread per core in each); a worker of one slot, a GPU job, or an OMP_NUM_THREADS the
    operator set is left alone."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    four = cpu_slots(4)
    assert cpu_threads(["cpu0"], four, cores=8) == {"OMP_NUM_THREADS": "2"}
    assert cpu_threads(["cpu0", "cpu1"], four, cores=8) == {"OMP_NUM_THREADS": "2"}  # two processes
    assert cpu_threads(["cpu3"], cpu_slots(16), cores=8) == {"OMP_NUM_THREADS": "1"}
    assert cpu_threads(["cpu0"], cpu_slots(1), cores=8) == {}
    assert cpu_threads(["0"], ["0", "1"], cores=8) == {}
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cpu_threads(["cpu0"], four, cores=8) == {}


def test_a_gpu_lock_is_exclusive_until_its_holder_lets_go(tmp_path: Path) -> None:
    first, second = DeviceLocks(tmp_path), DeviceLocks(tmp_path)
    assert first.acquire(["0", "1"], all_or_error=True) == ["0", "1"]
    with pytest.raises(DeviceError, match=f"GPU 1 \\(pid {os.getpid()}\\) is held by another worker"):
        second.acquire(["1", "2"], all_or_error=True)
    assert second.acquire(["1", "2"], all_or_error=False) == ["2"]  # takes what is free
    with pytest.raises(DeviceError, match=r"GPU 0 .* 1 .*held"):
        DeviceLocks(tmp_path).acquire(["0", "1"], all_or_error=False)  # nothing free at all
    first.release()
    assert DeviceLocks(tmp_path).acquire(["0", "1"], all_or_error=True) == ["0", "1"]
    assert DeviceLocks(tmp_path).acquire(["cpu0", "cpu1"], all_or_error=True) == ["cpu0", "cpu1"]


def _worker_row(db: Database, pid: int) -> WorkerRow | None:
    with db.session() as session, read(session):
        return session.query(WorkerRow).filter(WorkerRow.pid == pid).one_or_none()


@pytest.mark.e2e
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_two_worker_processes_never_share_a_gpu(
    settings_factory: Any, db_url: str, db: Database, tmp_path: Path
) -> None:
    # No job runs here: without the warm-start template the workers start at once.
    settings: Settings = settings_factory(db_url, device_lock_dir=tmp_path / "locks", warm_start=False)
    first = start_worker(settings, "--devices", "0,1", log=tmp_path / "first.log")
    try:
        row = wait_for(lambda: _worker_row(db, first.pid), timeout_s=60)
        assert row.devices == ["0", "1"]

        refused = subprocess.run(
            [*_worker_command(), "--devices", "1,2", "--exit-when-idle"],
            env=_env(settings),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode != 0
        assert f"GPU 1 (pid {first.pid}) is held by another worker" in refused.stderr

        # By default a worker takes the visible GPUs that no other worker holds.
        shared = subprocess.Popen(
            [*_worker_command(), "--exit-when-idle"], env={**_env(settings), "CUDA_VISIBLE_DEVICES": "0,1,2"}
        )
        assert shared.wait(60) == 0
        assert _worker_row(db, shared.pid).devices == ["2"]  # type: ignore[union-attr]

        os.kill(first.pid, signal.SIGKILL)  # the kernel drops a dead worker's locks
        first.wait(10)
        again = subprocess.run(
            [*_worker_command(), "--devices", "0,1", "--exit-when-idle"], env=_env(settings), timeout=60
        )
        assert again.returncode == 0
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(10)


def _worker_command() -> list[str]:
    import sys

    return [sys.executable, "-m", "worker"]


def _env(settings: Settings) -> dict[str, str]:
    from tests.support.e2e import worker_env

    return worker_env(settings)


# --- the claim ----------------------------------------------------------------------------------


def test_a_claim_takes_only_a_job_that_fits_the_free_devices(db: Database) -> None:
    with db.session() as session:
        wide = jobs_repo.create_job(session, spec={**TINY_JOB, "num_processes": 2}, priority=5)
        narrow = jobs_repo.create_job(session, spec=TINY_JOB)
    with db.session() as session:
        first = jobs_repo.claim_next(session, worker_id="w1", lease_s=60, max_processes=1)
        second = jobs_repo.claim_next(session, worker_id="w1", lease_s=60, max_processes=1)
    assert first is not None and first.id == narrow.id  # the wider job does not fit in one slot
    assert second is None
    with db.session() as session:
        claimed = jobs_repo.claim_next(session, worker_id="w2", lease_s=60, max_processes=2)
    assert claimed is not None and claimed.id == wide.id and claimed.num_processes == 2


def test_a_draining_worker_names_the_queued_jobs_too_wide_for_it(
    settings_factory: Any, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A 2-process job on a one-slot worker would wait forever: `--exit-when-idle` says which."""
    from worker.fleet.runner import Worker

    settings: Settings = settings_factory(db_url, warm_start=False)
    db = Database(settings.database_url)
    with db.session() as session:
        wide = jobs_repo.create_job(session, spec={**TINY_JOB, "num_processes": 2})
    try:
        with caplog.at_level("WARNING", logger="worker.fleet.runner"):
            outcomes = Worker(settings, db, devices=cpu_slots(1)).run(exit_when_idle=True)
        assert outcomes == []
        warnings = [r.getMessage() for r in caplog.records if "stay queued" in r.getMessage()]
        assert len(warnings) == 1 and f"job(s) {wide.id} stay queued" in warnings[0]
        assert "1 device(s)" in warnings[0]
        with db.session() as session:
            assert jobs_repo.get_job(session, job_id=wide.id).status == JobStatus.queued
    finally:
        db.dispose()


# --- concurrent jobs ------------------------------------------------------------------------------


def _most_at_once(spans: list[tuple[datetime, datetime, int]]) -> int:
    """The largest number of device slots in use at one instant, from (start, end, slots) spans."""
    edges = sorted([(s, w) for s, _, w in spans] + [(e, -w) for _, e, w in spans], key=lambda x: (x[0], x[1]))
    most = current = 0
    for _, change in edges:
        current += change
        most = max(most, current)
    return most


@pytest.mark.e2e
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_two_workers_with_two_slots_run_eight_jobs_each_once_four_at_a_time(
    settings_factory: Any, db_url: str, db: Database, tmp_path: Path
) -> None:
    settings: Settings = settings_factory(db_url)
    with db.session() as session:
        # The two-process job is queued first and outranks the others: it still waits until one
        # worker has both its slots free, while the single-slot jobs go ahead.
        wide = jobs_repo.create_job(
            session, spec={**TINY_JOB, "num_processes": 2, "max_train_samples": 16}, priority=1
        )
        singles = [jobs_repo.create_job(session, spec={**TINY_JOB, "seed": i}) for i in range(8)]
    workers = [
        start_worker(settings, "--slots", "2", "--exit-when-idle", log=tmp_path / f"worker{i}.log")
        for i in range(2)
    ]
    try:
        for i, worker in enumerate(workers):
            assert worker.wait(300) == 0, (tmp_path / f"worker{i}.log").read_text()[-3000:]
    finally:
        for worker in workers:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait(10)

    with db.session() as session, read(session):
        jobs = {job.id: job for job in session.query(Job).all()}
        claims = [e for e in session.query(JobEvent).all() if e.message.startswith("claimed by worker")]
        worker_ids = {w.pid: w.id for w in session.query(WorkerRow).all()}
    for job in jobs.values():
        assert job.status == JobStatus.succeeded, job.error
        assert job.attempts == 1
    assert sorted(e.job_id for e in claims) == sorted(jobs)  # each job claimed exactly once
    assert jobs[wide.id].devices == ["cpu0", "cpu1"]
    assert all(len(jobs[s.id].devices or []) == 1 for s in singles)

    spans = [(j.started_at, j.finished_at, j.num_processes, j.worker_id) for j in jobs.values()]
    assert all(start is not None and end is not None for start, end, _, _ in spans)
    overall = _most_at_once([(s, e, 1) for s, e, _, _ in spans])  # type: ignore[misc]
    assert 3 <= overall <= 4, f"{overall} jobs ran at once"
    for worker_id in {w for *_, w in spans}:
        assert worker_id in worker_ids.values()
        mine = [(s, e, n) for s, e, n, w in spans if w == worker_id]
        assert _most_at_once(mine) <= 2, f"worker {worker_id} ran more than its 2 slots at once"  # type: ignore[arg-type]
