"""A worker's disk per job is bounded with an object store (issue 34 item 2): a checkpoint's local copy
goes once a newer one is declared (in the store whole), so a job with no save_total_limit holds at
most three checkpoints here (the newest declared, the one uploading, the one being written), however
many it saves. A tiny BERT on real SST-2 rows, a store mirrored as S3 is (test_checkpoint_uploads.py's
HeldStore idea: a folder reached through fsspec, watched at every upload)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fsspec.implementations.local import LocalFileSystem

from shared.core.config import Settings
from shared.core.storage import Store
from shared.wire.job_folder import CHECKPOINT_PREFIX
from tests.support.runs import RecordingReporter, saving_spec
from worker.training.job_storage import JobStorage
from worker.training.loop import run_training

JOB_ID = 1
EVERY = 2  # 16 steps (32 rows, batch 2): 8 checkpoints, no save_total_limit


class WatchedStore(Store):
    """A folder mirrored as S3 is; at every upload it notes what the job's folder holds."""

    def __init__(self, root: Path, job: Path) -> None:
        super().__init__(
            LocalFileSystem(auto_mkdir=True), str(root), url=str(root), local_root=None, retry_s=0.0
        )
        self.job = job
        self.most_folders = 0
        self.most_bytes = 0

    def put(self, local: Path, key: str) -> None:
        checkpoints = self.job / "checkpoints"
        folders = [c for c in checkpoints.iterdir() if c.name.startswith(CHECKPOINT_PREFIX)]
        self.most_folders = max(self.most_folders, len(folders))
        self.most_bytes = max(
            self.most_bytes, sum(f.stat().st_size for f in checkpoints.rglob("*") if f.is_file())
        )
        super().put(local, key)


def _checkpoint_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def test_local_checkpoint_copies_are_pruned_once_in_the_store(
    train_settings: Settings, tmp_path: Path
) -> None:
    job = tmp_path / "job"
    store = WatchedStore(tmp_path / "store", job)
    reporter = RecordingReporter()
    storage = JobStorage(store, JOB_ID, job)
    spec: Any = saving_spec(EVERY, per_device_train_batch_size=2)
    result = run_training(spec, train_settings, output_dir=job, reporter=reporter, storage=storage)

    saved = [c["step"] for c in reporter.checkpoints]
    assert saved == list(range(EVERY, 17, EVERY))  # 8 checkpoints, every one declared
    assert storage.stored_steps() == saved  # all of them in the store
    assert result["completed_steps"] == 16
    # Here: only the newest declared one is left; during the run never more than three at once.
    assert sorted(c.name for c in (job / "checkpoints").iterdir()) == ["checkpoint-16"]
    assert 2 <= store.most_folders <= 3, store.most_folders
    one = _checkpoint_bytes(job / "checkpoints" / "checkpoint-16")
    # The bound fleet.md states (measured: 25.8 MB at most for 12.9 MB checkpoints, two at once).
    assert store.most_bytes <= 3 * one * 1.05, (store.most_bytes, one)
