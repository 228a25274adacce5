"""Checkpoint uploads beside training (issue 23): the steps after a save train while its checkpoint
goes to the object store, and the checkpoint is declared only once the upload completed.

Declared = durable = resumable (worker/training/checkpoints.py) still holds: a checkpoint's row is written
through the attempt's fence only after its last file (gluejobs_state.json) is in the store, by the
training thread, at the first step boundary after the upload ended (`poll`). What the background
thread does is the upload alone; everything that reports, rotates or raises stays on the training
thread, so the reporter and the accelerator are never used from two threads.

Bounds: one upload in flight per job. A save that comes while the previous checkpoint still uploads
waits for that upload (and declares it) before it starts its own. Waiting, not skipping: skipping
would silently change which steps are resumable and which one `save_total_limit` and the best
checkpoint refer to, and a save interval shorter than an upload is a configuration the waiting
makes visible (the steps/s fall) rather than one that quietly saves less. So the local disk holds at
most three checkpoints (the newest declared, the one uploading, the one being written: older local
copies go once a newer one is declared, JobStorage.prune_local), and memory holds one upload's parts
(shared/core/storage.py PART_BYTES).

What a crash costs with an object store: the steps since the newest *declared* checkpoint, so up to
one save interval plus the steps trained while the newest one uploaded (under two intervals, as the
next save waits for the upload). Making every save wait for its own upload would bring that to one
interval at the cost of the overlap on every save of every job; docs/operators/fleet-guarantees.md
states the bound per store and why.

Failures: an upload that fails (the store away for longer than GLUEJOBS_STORAGE_RETRY_S, or a
checkpoint an attempt that lost its lease already wrote) is never declared; its error is raised on
the training thread at the next step boundary, so the job fails or is retried exactly as when the
upload was synchronous (StoreUnavailable → `storage_unreachable`, a new attempt). A process killed
mid-upload leaves a folder in the store without its state file; the next attempt resumes from the
last declared checkpoint and removes it (JobStorage.reconcile).

The end: the SIGTERM save and the run's end wait for the upload in flight (`wait`), so a job that
succeeded or drained has every checkpoint it saved declared.

With the local store there is nothing to upload: a checkpoint is declared as soon as it is
published, as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from worker.training.job_storage import JobStorage

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SavedCheckpoint:
    """A published checkpoint and what its row will say once it is declared."""

    step: int
    epoch: float
    folder: Path
    metrics: dict[str, float] = field(default_factory=dict)
    is_best: bool = False


class CheckpointUploads:
    """One job's checkpoint uploads, at most one in flight; `declare` is called on the training thread
    for each checkpoint whose upload completed, in the order they were saved."""

    def __init__(self, storage: JobStorage, declare: Callable[[SavedCheckpoint], None]) -> None:
        self._storage = storage
        self._declare = declare
        self._in_flight: SavedCheckpoint | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._started = 0.0

    @property
    def in_flight(self) -> SavedCheckpoint | None:
        return self._in_flight

    def submit(self, saved: SavedCheckpoint) -> None:
        """Start uploading `saved` (declared once it is in the store); a previous upload still running
        is waited for first."""
        self.wait()
        if not self._storage.mirrored:
            self._declare(saved)
            return
        self._in_flight, self._error, self._started = saved, None, time.perf_counter()
        # A daemon: a run that fails abandons its upload (never declared), it does not hold the
        # process up; the next attempt removes what it left in the store.
        self._thread = threading.Thread(
            target=self._upload, args=(saved.folder,), name=f"upload-{saved.folder.name}", daemon=True
        )
        self._thread.start()

    def poll(self) -> None:
        """Declare the upload in flight if it has completed; raise its error if it failed."""
        if self._thread is not None and not self._thread.is_alive():
            self._finish()

    def wait(self) -> None:
        """Wait for the upload in flight, then declare it (or raise its error)."""
        if self._thread is None:
            return
        if self._thread.is_alive():
            assert self._in_flight is not None
            logger.info("waiting for the upload of %s", self._in_flight.folder.name)
            waited = time.perf_counter()
            self._thread.join()
            logger.info("waited %.2f s for the upload", time.perf_counter() - waited)
        self._finish()

    def _upload(self, folder: Path) -> None:
        try:
            self._storage.upload_checkpoint(folder)
        except BaseException as exc:  # handed to the training thread, which raises it
            self._error = exc

    def _finish(self) -> None:
        saved, error = self._in_flight, self._error
        self._thread, self._in_flight, self._error = None, None, None
        if error is not None:
            raise error
        assert saved is not None
        logger.info(
            "%s is in the store %.2f s after its save; declaring it",
            saved.folder.name,
            time.perf_counter() - self._started,
        )
        self._declare(saved)
