"""Checkpoint uploads beside training (worker/training/checkpoint_uploads.py, issue 23), with a tiny BERT on
real SST-2 rows and an object store that is a folder reached through fsspec the way S3 is (mirrored:
the job trains in a folder of its own and uploads): the steps after a save train while it uploads,
a checkpoint is declared only once it is in the store, a failed upload is never declared and the
next attempt retries its steps, and a process SIGKILLed mid-upload resumes from the last declared
checkpoint."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from fsspec.implementations.local import LocalFileSystem

from shared.core.config import Settings
from shared.core.storage import Store, StoreUnavailable
from shared.core.tables import ErrorCode
from shared.wire.job_folder import STATE_FILE
from tests.support.runs import RecordingReporter, saving_spec
from worker.fleet.outcome import classify
from worker.training.job_storage import JobStorage
from worker.training.loop import run_training

JOB_ID = 1
EVERY = 4  # a checkpoint every 4 steps of the 16 (32 rows, batch 2)
WAIT_S = 120.0  # how long a held upload waits for what it waits for before it gives up
SPAWN_WAIT_S = 600.0  # how long the kill test waits for its spawned process to reach the upload


def _spec() -> Any:
    return saving_spec(EVERY, per_device_train_batch_size=2)


class HeldStore(Store):
    """A store in a folder, mirrored as S3 is, whose uploads can be held or refused per checkpoint."""

    def __init__(self, root: Path, *, hold: Any = None, refuse: str | None = None) -> None:
        super().__init__(
            LocalFileSystem(auto_mkdir=True), str(root), url=str(root), local_root=None, retry_s=0.0
        )
        self.hold = hold  # called before each upload with its key: returns once the upload may go on
        self.refuse = refuse  # uploads under this checkpoint's name fail as an outage would

    def put(self, local: Path, key: str) -> None:
        if self.refuse is not None and f"/{self.refuse}/" in key:
            raise StoreUnavailable(f"the file store did not answer (could not upload {key})")
        if self.hold is not None:
            self.hold(key)
        super().put(local, key)


def _train(
    store: Store, local: Path, settings: Settings, reporter: Any, resume_from: Path | None = None
) -> Any:
    storage = JobStorage(store, JOB_ID, local)
    return run_training(
        _spec(), settings, output_dir=local, reporter=reporter, storage=storage, resume_from=resume_from
    )


def _train_steps(reporter: RecordingReporter) -> list[int]:
    return reporter.steps("train")


def test_the_steps_after_a_save_train_while_it_uploads_and_it_is_declared_once_in_the_store(
    train_settings: Settings, tmp_path: Path
) -> None:
    reporter = RecordingReporter()
    seen: dict[str, tuple[int, list[int]]] = {}

    def hold(key: str) -> None:
        # The first checkpoint's last file (its state: the mark of a whole one) waits for a training
        # row of a later step. Were the upload on the training path, that row could not come.
        if key.endswith(f"checkpoint-{EVERY}/{STATE_FILE}"):
            deadline = time.monotonic() + WAIT_S
            while max(_train_steps(reporter), default=0) <= EVERY and time.monotonic() < deadline:
                time.sleep(0.01)
        seen[key] = (max(_train_steps(reporter), default=0), [c["step"] for c in reporter.checkpoints])

    store = HeldStore(tmp_path / "store", hold=hold)
    result = _train(store, tmp_path / "job", train_settings, reporter)

    trained, declared = seen[f"jobs/{JOB_ID}/checkpoints/checkpoint-{EVERY}/{STATE_FILE}"]
    assert trained > EVERY  # a later step's row was reported while checkpoint-4 uploaded
    assert EVERY not in declared  # and checkpoint-4 was not declared before it was in the store
    assert [c["step"] for c in reporter.checkpoints] == [4, 8, 12, 16]  # every save declared, in order
    assert reporter.checkpoints[0]["path"].endswith(f"jobs/{JOB_ID}/checkpoints/checkpoint-4")
    assert JobStorage(store, JOB_ID, tmp_path / "job").stored_steps() == [4, 8, 12, 16]
    assert result["completed_steps"] == 16


def test_a_checkpoint_whose_upload_fails_is_never_declared_and_the_next_attempt_retrains_it(
    train_settings: Settings, tmp_path: Path
) -> None:
    reporter = RecordingReporter()
    store = HeldStore(tmp_path / "store", refuse="checkpoint-8")
    local = tmp_path / "job"

    with pytest.raises(StoreUnavailable) as failed:
        _train(store, local, train_settings, reporter)

    assert classify(failed.value) == ErrorCode.storage_unreachable and ErrorCode.storage_unreachable.retryable
    assert [c["step"] for c in reporter.checkpoints] == [4]  # checkpoint-8 never declared
    # The next attempt: resumes from the last declared checkpoint, removes what nobody declared.
    store.refuse = None
    again = JobStorage(store, JOB_ID, local)
    found = again.reconcile([4])
    assert found.resume_from == local / "checkpoints" / "checkpoint-4"
    assert "checkpoint-8" in found.removed
    retried = RecordingReporter()
    result = _train(store, local, train_settings, retried, resume_from=found.resume_from)
    assert _train_steps(retried)[0] == 5
    assert [c["step"] for c in retried.checkpoints] == [8, 12, 16]
    assert result["completed_steps"] == 16


def _train_until_killed(root: str, held: str, declared_file: str, settings_json: str) -> None:
    """In a process of its own: train, recording each declared step in `declared_file`; the upload of
    `held` blocks forever (the test SIGKILLs this process while it does)."""
    root_path = Path(root)

    class FileReporter(RecordingReporter):
        def checkpoint(self, **row: Any) -> None:
            super().checkpoint(**row)
            with open(declared_file, "a") as out:
                out.write(f"{row['step']}\n")

    def hold(key: str) -> None:
        if f"/{held}/" in key:
            (root_path / "uploading").write_text(key)
            time.sleep(3600)

    settings = Settings.model_validate_json(settings_json)
    _train(HeldStore(root_path / "store", hold=hold), root_path / "job", settings, FileReporter())


@pytest.mark.e2e  # a process of its own, as a worker starts it
def test_a_process_killed_during_an_upload_resumes_from_the_last_declared_checkpoint(
    train_settings: Settings, tmp_path: Path
) -> None:
    declared_file = tmp_path / "declared.txt"
    declared_file.touch()
    process = multiprocessing.get_context("spawn").Process(
        target=_train_until_killed,
        args=(str(tmp_path), "checkpoint-8", str(declared_file), train_settings.model_dump_json()),
    )
    process.start()
    try:
        # A spawned process imports torch and transformers before its first step: minutes on a loaded
        # machine, hence a longer wait than a held upload's.
        started = time.monotonic()
        deadline = started + SPAWN_WAIT_S
        while not (tmp_path / "uploading").exists() and process.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "uploading").exists(), (
            f"the job never started uploading checkpoint-8 (process alive: {process.is_alive()}, "
            f"exit code {process.exitcode}, waited {time.monotonic() - started:.0f} s, "
            f"declared {declared_file.read_text().split()})"
        )
        assert process.pid is not None
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.join(30)
    assert process.exitcode == -signal.SIGKILL
    declared = [int(line) for line in declared_file.read_text().split()]
    assert declared == [4]

    store = HeldStore(tmp_path / "store")
    found = JobStorage(store, JOB_ID, tmp_path / "job").reconcile(declared)
    assert found.resume_from == tmp_path / "job" / "checkpoints" / "checkpoint-4"
    assert "checkpoint-8" in found.removed
    resumed = RecordingReporter()
    result = _train(store, tmp_path / "job", train_settings, resumed, resume_from=found.resume_from)
    assert _train_steps(resumed)[0] == 5
    assert [c["step"] for c in resumed.checkpoints] == [8, 12, 16]
    assert result["completed_steps"] == 16
    assert (
        json.loads((tmp_path / "job" / "checkpoints" / "checkpoint-16" / STATE_FILE).read_text())[
            "completed_steps"
        ]
        == 16
    )
