"""Warm start: jobs forked from a template process keep today's isolation.

A real worker process with its real template (multiprocessing's forkserver with torch imported),
real jobs on GLUE rows, real SIGKILL and cancel.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from shared import jobs_repo
from shared.core.config import Settings
from shared.core.db import Database
from shared.core.tables import Job, JobStatus
from tests.support.e2e import start_worker, wait_for
from tests.support.kit import QUICK_JOB
from worker.fleet.warm import WarmStarter, take_the_thread_count

SMALL = {**QUICK_JOB, "logging_steps": 1, "seed": 5}
# Trains until it is stopped.
LONG = {**SMALL, "max_train_samples": 4000, "num_train_epochs": 50}
FORKED = re.compile(r"warm start: job process (\d+) forked from template (\d+) \((.*)\)")


def _log(settings: Settings, job_id: int, attempt: int = 1) -> Path:
    return settings.job_dir(job_id) / "logs" / f"attempt-{attempt}.log"


def _forked(settings: Settings, job_id: int) -> re.Match[str] | None:
    path = _log(settings, job_id)
    return FORKED.search(path.read_text()) if path.is_file() else None


def _job(db: Database, job_id: int) -> Job:
    with db.session() as session:
        return jobs_repo.get_job(session, job_id=job_id)


def _submit(db: Database, spec: dict[str, Any]) -> int:
    with db.session() as session:
        return jobs_repo.create_job(session, spec=spec, max_attempts=1).id


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.e2e
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_killed_or_cancelled_job_ends_alone_and_the_template_serves_the_next(
    settings_factory: Any, db_url: str, db: Database, tmp_path: Path
) -> None:
    settings: Settings = settings_factory(db_url, device_lock_dir=tmp_path / "locks", heartbeat_s=0.3)
    killed = _submit(db, LONG)
    worker = start_worker(settings, "--devices", "3", log=tmp_path / "worker.log")
    try:
        forked = wait_for(lambda: _forked(settings, killed), timeout_s=120)
        child, template = int(forked[1]), int(forked[2])
        # The template forked from one thread, never touched CUDA, and gave the job only its GPU.
        assert "template threads: 1, CUDA initialised in the template: False" in forked[3]
        assert "CUDA_VISIBLE_DEVICES='3'" in forked[3]
        wait_for(lambda: _job(db, killed).latest_metrics.get("train"), timeout_s=120)

        os.kill(child, signal.SIGKILL)  # the out-of-memory killer's way
        failed = wait_for(lambda: (j := _job(db, killed)).status.is_terminal and j, timeout_s=60)
        assert failed.status == JobStatus.failed and "killed by SIGKILL" in (failed.error or "")

        cancelled = _submit(db, LONG)
        forked = wait_for(lambda: _forked(settings, cancelled), timeout_s=60)
        assert int(forked[2]) == template  # the same template, still serving
        wait_for(lambda: _job(db, cancelled).latest_metrics.get("train"), timeout_s=120)
        with db.session() as session:
            jobs_repo.request_cancel(session, job_id=cancelled)
        wait_for(lambda: _job(db, cancelled).status == JobStatus.cancelled, timeout_s=60)
        with pytest.raises(ProcessLookupError):  # the cancel reached the job's whole process group
            os.killpg(int(forked[1]), 0)

        done = _submit(db, SMALL)
        wait_for(lambda: _job(db, done).status.is_terminal, timeout_s=120)
        assert _job(db, done).status == JobStatus.succeeded, _job(db, done).error
        log = _log(settings, done).read_text()
        forked = FORKED.search(log)
        assert forked is not None and int(forked[2]) == template and int(forked[1]) != child
        assert (
            f"[job {done}] worker.training.loop: parameters:" in log
        )  # stderr (logging) lands in the log too
        assert worker.poll() is None and _alive(template)

        os.kill(template, signal.SIGKILL)  # the template itself dies: the worker starts another
        after = _submit(db, SMALL)
        wait_for(lambda: _job(db, after).status.is_terminal, timeout_s=120)
        assert _job(db, after).status == JobStatus.succeeded, _job(db, after).error
        forked = _forked(settings, after)
        assert forked is not None and int(forked[2]) != template
        assert worker.poll() is None
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(60)


def test_jobs_that_need_a_fresh_interpreter_are_not_forked() -> None:
    def job(**spec: Any) -> Job:
        return Job(id=1, spec={**SMALL, **spec}, num_processes=int(spec.get("num_processes", 1)))

    warm = WarmStarter()
    assert warm.serves(job())
    assert not warm.serves(job(num_processes=2))  # accelerate launch
    assert not warm.serves(job(use_deterministic_algorithms=True))  # PYTHONHASHSEED


def test_a_local_tokenizers_fingerprint_is_remembered_and_follows_its_files(
    models_dir: Path, tmp_path: Path
) -> None:
    """Part of a job's start: the tokenisation cache's key is read from a memo, not re-pickled."""
    import shutil

    from transformers import AutoTokenizer

    from worker.training.data import tokenizer_fingerprint

    folder = tmp_path / "tok"
    shutil.copytree(models_dir / "tiny-bert", folder)
    memo = tmp_path / "memo"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    computed = tokenizer_fingerprint(tokenizer)
    assert tokenizer_fingerprint(tokenizer, memo_dir=memo) == computed
    (remembered,) = memo.iterdir()
    assert remembered.read_text() == computed
    assert tokenizer_fingerprint(AutoTokenizer.from_pretrained(folder), memo_dir=memo) == computed

    config = folder / "tokenizer_config.json"
    config.write_text(config.read_text().replace('"do_lower_case": true', '"do_lower_case": false'))
    changed = AutoTokenizer.from_pretrained(folder)
    assert tokenizer_fingerprint(changed, memo_dir=memo) == tokenizer_fingerprint(changed) != computed
    assert len(list(memo.iterdir())) == 2


def test_a_forked_job_takes_its_thread_count_from_its_environment() -> None:
    """torch in the template read OMP_NUM_THREADS before the fork: the job's own count (its share of
    a CPU worker's cores) is applied to it; a missing or malformed one leaves torch as it is."""
    import torch

    before = torch.get_num_threads()
    try:
        take_the_thread_count({"OMP_NUM_THREADS": "3"})
        assert torch.get_num_threads() == 3
        for ignored in ({}, {"OMP_NUM_THREADS": "0"}, {"OMP_NUM_THREADS": "two"}):
            take_the_thread_count(ignored)
            assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
