"""A job's folder on this machine and, with an object store, its copy there (shared/core/storage.py).

With the local store (GLUEJOBS_STORAGE_URL unset) the job's folder on this machine *is* the store's
copy, and everything here is what worker/training/checkpoints.py does on its own. With an object store the
worker trains in a folder of its own disk and the store holds what counts:

- A checkpoint is uploaded before it is declared (worker/training/checkpoints.py: declared = durable =
  resumable), its gluejobs_state.json last, so a checkpoint folder in the store is complete exactly
  when that file is there. A new attempt, on any machine, resumes from the newest declared
  checkpoint the store holds whole, fetched into its own folder; the store's folders nobody declared
  are removed, as the local ones are.
- Rotation (save_total_limit) is decided on the store's checkpoints and removes the doomed ones in
  both places; besides, once a checkpoint is declared the local copies older than it go
  (`prune_local`), so the local folder holds at most three checkpoints whatever the limit.
- The final model, tokenizer, predictions, GLUE submission files and tracker files are uploaded
  before the job's process says it succeeded; each attempt's log is copied while it runs (best
  effort, between heartbeats) and once more when it ends; then the local folder goes.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from shared.core.config import Settings
from shared.core.storage import Store, open_store
from shared.wire.job_folder import (
    CHECKPOINT_PREFIX,
    CHECKPOINTS,
    LOG_DIR,
    PARTIAL_SUFFIX,
    STATE_FILE,
    checkpoint_name,
    checkpoint_step,
    job_key,
)
from worker.training import checkpoints
from worker.training.checkpoints import CheckpointConflict, Reconciled

logger = logging.getLogger(__name__)

WAIT_POLL_S = 0.5


class JobStorage:
    """One job's files: `local` on this machine, mirrored to `store` unless the store is local."""

    def __init__(self, store: Store, job_id: int, local: Path) -> None:
        self.store = store
        self.job_id = job_id
        self.local = local

    @classmethod
    def of(cls, settings: Settings, job_id: int, store: Store | None = None) -> JobStorage:
        return cls(store or open_store(settings), job_id, settings.job_dir(job_id))

    @classmethod
    def local_only(cls, folder: Path) -> JobStorage:
        """A folder that is its own store (a training run outside a worker: tests, benchmarks)."""
        from fsspec.implementations.local import LocalFileSystem

        root = folder.resolve()
        return cls(
            Store(LocalFileSystem(), str(root), url=str(root), local_root=root, retry_s=0.0), 0, folder
        )

    @property
    def mirrored(self) -> bool:
        return not self.store.is_local

    @property
    def checkpoints_dir(self) -> Path:
        return self.local / CHECKPOINTS

    @property
    def location(self) -> str:
        """Where the job's files are, as the job row records it (output_dir)."""
        return str(self.local) if not self.mirrored else self.store.location(job_key(self.job_id))

    def _key(self, relative: str) -> str:
        return job_key(self.job_id, relative)

    # --- checkpoints --------------------------------------------------------------------------------

    def upload_checkpoint(self, folder: Path) -> None:
        """Upload a published checkpoint folder, its state file last (the mark of a whole one).
        CheckpointConflict when the store already holds a whole one at that step (written by an
        attempt that lost its lease), as `checkpoints.publish` refuses locally."""
        if not self.mirrored:
            return
        prefix = f"{CHECKPOINTS}/{folder.name}"
        if self.store.exists(self._key(f"{prefix}/{STATE_FILE}")):
            raise CheckpointConflict(
                f"the store already holds {folder.name} and this attempt did not write it (an attempt "
                "that lost its lease did): the job goes to a new attempt"
            )
        started = time.perf_counter()
        files = sorted((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.name == STATE_FILE)
        for path in files:
            self.store.put(path, self._key(f"{prefix}/{path.relative_to(folder).as_posix()}"))
        logger.info(
            "job %s: uploaded %s (%.1f MB) in %.2f s",
            self.job_id,
            folder.name,
            sum(p.stat().st_size for p in files) / 1e6,
            time.perf_counter() - started,
        )

    def checkpoint_location(self, folder: Path) -> str:
        """Where a checkpoint is, as its row records it: the local folder, or its place in the store."""
        if not self.mirrored:
            return str(folder)
        return self.store.location(self._key(f"{CHECKPOINTS}/{folder.name}"))

    def stored_steps(self) -> list[int]:
        """The steps of the checkpoints the store holds whole."""
        if not self.mirrored:
            return checkpoints.saved_steps(self.checkpoints_dir)
        steps = set()
        for stored in self.store.list(self._key(CHECKPOINTS)):
            parts = PurePosixPath(stored.path).parts
            step = checkpoint_step(parts[0])
            if len(parts) == 2 and parts[1] == STATE_FILE and step is not None:
                steps.add(step)
        return sorted(steps)

    def rotate(self, *, keep: int | None, best_step: int | None) -> list[int]:
        """Keep the newest `keep` checkpoints and the best one, in the store and here; the steps deleted."""
        if not self.mirrored:
            return checkpoints.rotate(self.checkpoints_dir, keep=keep, best_step=best_step)
        checkpoints.remove_staging(self.checkpoints_dir)
        if keep is None:
            return []
        steps = self.stored_steps()
        retained = set(steps[-keep:]) | ({best_step} if best_step is not None else set())
        doomed = [step for step in steps if step not in retained]
        self._remove(doomed)
        return doomed

    def prune_local(self, declared_step: int) -> list[int]:
        """With an object store, this machine's copies of the checkpoints older than `declared_step`
        (just declared: in the store whole) go; the steps removed. The newest declared checkpoint
        stays, so a resume here needs no download; newer folders (published, still uploading) and
        staging folders are not touched. Without this a job with no save_total_limit kept every
        checkpoint's local copy and filled a worker's disk by itself (issue 34 item 2): with it a
        job's disk holds at most three checkpoints (the newest declared, the one uploading, the one
        being written) besides its outputs; docs/operators/fleet.md states the bound."""
        if not self.mirrored:
            return []  # the local folder is the store's: rotation alone decides
        removed = [step for step in checkpoints.saved_steps(self.checkpoints_dir) if step < declared_step]
        for step in removed:
            shutil.rmtree(checkpoints.checkpoint_path(self.checkpoints_dir, step), ignore_errors=True)
        if removed:
            logger.info("job %s: removed the local copies of stored checkpoints %s", self.job_id, removed)
        return removed

    def _remove(self, steps: Iterable[int]) -> None:
        for step in steps:
            name = checkpoint_name(step)
            self.store.delete(self._key(f"{CHECKPOINTS}/{name}"))
            shutil.rmtree(self.checkpoints_dir / name, ignore_errors=True)

    def local_checkpoint(self, step: int) -> Path:
        """The checkpoint at `step` in this machine's folder, fetched from the store when it is not."""
        folder = checkpoints.checkpoint_path(self.checkpoints_dir, step)
        if not self.mirrored or checkpoints.is_complete(folder):
            return folder
        fetching = folder.with_name(f"{folder.name}.fetch{PARTIAL_SUFFIX}")
        shutil.rmtree(fetching, ignore_errors=True)
        prefix = self._key(f"{CHECKPOINTS}/{folder.name}")
        started = time.perf_counter()
        stored = self.store.list(prefix)
        for item in sorted(stored, key=lambda f: f.path == STATE_FILE):  # complete once the state is in
            self.store.get(f"{prefix}/{item.path}", fetching / item.path)
        shutil.rmtree(folder, ignore_errors=True)
        os.rename(fetching, folder)
        logger.info(
            "job %s: fetched %s from the store in %.2f s",
            self.job_id,
            folder.name,
            time.perf_counter() - started,
        )
        return folder

    def reconcile(self, declared: Iterable[int], *, remove: bool = True) -> Reconciled:
        """`checkpoints.reconcile` against the store: what to resume from (fetched here), what nobody
        declared (removed from the store and from here, by the main process), what the database
        declared that the store does not hold whole (`forgotten`). Other processes of the job only
        wait for the main one's copy."""
        if not self.mirrored:
            return checkpoints.reconcile(self.checkpoints_dir, declared, remove=remove)
        declared_steps = set(declared)
        complete = set(self.stored_steps())
        resumable = sorted(declared_steps & complete)
        removed: list[str] = []
        if remove:
            names = {PurePosixPath(f.path).parts[0] for f in self.store.list(self._key(CHECKPOINTS))}
            if self.checkpoints_dir.is_dir():
                names |= {child.name for child in self.checkpoints_dir.iterdir() if child.is_dir()}
            for name in sorted(names):
                if name.startswith(CHECKPOINT_PREFIX) and checkpoint_step(name) not in resumable:
                    self.store.delete(self._key(f"{CHECKPOINTS}/{name}"))
                    shutil.rmtree(self.checkpoints_dir / name, ignore_errors=True)
                    removed.append(name)
        resume_from = None
        if resumable:
            resume_from = self.local_checkpoint(resumable[-1]) if remove else self._await(resumable[-1])
        return Reconciled(
            resume_from=resume_from, removed=removed, forgotten=sorted(declared_steps - complete)
        )

    def _await(self, step: int) -> Path:
        """The main process's copy of the checkpoint at `step`, once it is whole."""
        folder = checkpoints.checkpoint_path(self.checkpoints_dir, step)
        deadline = time.monotonic() + self.store.retry_s
        while not checkpoints.is_complete(folder):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the main process did not fetch {folder.name} in time")
            time.sleep(WAIT_POLL_S)
        return folder

    # --- outputs and logs ---------------------------------------------------------------------------

    def upload_outputs(self) -> None:
        """Everything the run left in its folder but checkpoints and logs (uploaded on their own):
        the model and tokenizer, predictions, GLUE submission files, tracker files."""
        if not self.mirrored:
            return
        for path in sorted(p for p in self.local.rglob("*") if p.is_file()):
            relative = path.relative_to(self.local)
            if relative.parts[0] in (CHECKPOINTS, LOG_DIR):
                continue
            self.store.put(path, self._key(relative.as_posix()))

    def upload_log(self, path: Path, *, once: bool = False) -> None:
        """Copy an attempt's log to the store (`once`: a single try, for the copies made while the job
        runs, which must never hold up a heartbeat)."""
        if not self.mirrored or not path.is_file():
            return
        key = self._key(f"{LOG_DIR}/{path.name}")
        if once:
            self.store.once(lambda quick: quick.put(path, key))
        else:
            self.store.put(path, key)

    def remove_local(self) -> None:
        """The job's folder on this machine, once everything in it is in the store."""
        if self.mirrored:
            shutil.rmtree(self.local, ignore_errors=True)
