"""Checkpoint folders: atomic saves, rotation (save_total_limit), the state a resumed run needs, and
which folder a new attempt may resume from.

A checkpoint folder is also a model, as Trainer's are: the model's `from_pretrained` files (for LoRA,
the adapter) and the tokenizer, beside Accelerate's optimizer, scheduler and RNG states and
`gluejobs_state.json`.

Declared = durable = resumable. A checkpoint counts once it is *declared*: its row written through
the attempt's fence (worker/fleet/db_reporter.py `QueuedReporter.checkpoint`, which first flushes every row
logged before it). The life of one, in order: written into a staging folder of the attempt's own
(`staging_path`) → published (renamed into place, `publish`) → with an object store, uploaded
beside the next training steps (worker/training/checkpoint_uploads.py) → declared. A later attempt resumes
only from the newest declared checkpoint whose folder is complete, and removes every folder nobody
declared (`reconcile`): a process killed between publishing and declaring — its worker SIGKILLed
during a database outage, say — leaves a folder the database never heard of, and the rows it still
held in memory were lost with it; resuming from the declared checkpoint before it trains those steps
again and logs them again (metric rows are unique per step, so a row that did reach the database
is kept once). Why not carry the unflushed rows in the folder (a journal replayed by the next
attempt) instead: a folder the database never heard of would then have to be trusted as durable,
and once checkpoints are uploaded to an object store before they are declared (so that a resume
works on another machine), an undeclared folder on a dead machine's disk is not there to replay.
The price is re-training the steps since the last declared checkpoint, only after a crash; a
SIGTERM drain declares its checkpoint first and re-trains nothing.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from shared.core.errors import GluejobsError
from shared.wire.job_folder import (
    CHECKPOINT_PREFIX,
    PARTIAL_SUFFIX,
    STATE_FILE,
    checkpoint_name,
    checkpoint_step,
)

logger = logging.getLogger(__name__)

# The attempt a job's processes run (set by the worker, worker/fleet/launch.py): every rank of an attempt
# writes its checkpoints into the same staging folder, and two attempts never share one.
ATTEMPT_ENV = "GLUEJOBS_ATTEMPT"


class CheckpointConflict(GluejobsError):
    """A checkpoint folder this attempt did not write is where it would publish its own."""

    # Only an attempt that lost its lease writes beside the current one: retried (a new attempt
    # removes the folder nobody declared), never a failure of the job's own.
    failure_code = "worker_lost"


@dataclass
class TrainingState:
    """What `save_state` does not know: where the loop was, and the best evaluation so far."""

    completed_steps: int
    epoch: float
    best_value: float | None = None
    best_step: int | None = None
    # Evaluations in a row without improvement (early stopping's patience), so a resumed run stops
    # where the uninterrupted one would.
    evaluations_without_improvement: int = 0

    def write(self, folder: Path) -> None:
        (folder / STATE_FILE).write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, folder: Path) -> TrainingState:
        return cls(**json.loads((folder / STATE_FILE).read_text()))


def checkpoint_path(checkpoints_dir: Path, step: int) -> Path:
    return checkpoints_dir / checkpoint_name(step)


def staging_path(final: Path) -> Path:
    """Where a checkpoint is written before it is renamed into place, so a crash mid-save leaves
    no half-written checkpoint behind to resume from. Named after the attempt: an attempt that lost
    its lease and still runs for a moment never writes into the current attempt's folder."""
    return final.with_name(f"{final.name}.attempt-{os.environ.get(ATTEMPT_ENV, '0')}{PARTIAL_SUFFIX}")


def publish(staging: Path, final: Path) -> None:
    """Rename the written checkpoint into place. Never over another folder: rename(2) refuses a
    non-empty target, so an attempt that lost its lease cannot replace the current attempt's
    checkpoint, whatever the timing. (In the current attempt `final` never exists: `reconcile`
    removed every folder past the checkpoint it resumed from; one that appeared since was written
    by an attempt that lost its lease, and CheckpointConflict hands the job to a new attempt.)"""
    try:
        os.rename(staging, final)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        shutil.rmtree(staging, ignore_errors=True)
        raise CheckpointConflict(
            f"{final.name} exists and this attempt did not write it (an attempt that lost its lease "
            "did): the job goes to a new attempt, which removes it"
        ) from exc


def is_complete(folder: Path) -> bool:
    return folder.is_dir() and (folder / STATE_FILE).is_file()


def saved_steps(checkpoints_dir: Path) -> list[int]:
    if not checkpoints_dir.is_dir():
        return []
    steps = []
    for child in checkpoints_dir.iterdir():
        step = checkpoint_step(child.name)
        if step is not None and is_complete(child):
            steps.append(step)
    return sorted(steps)


def rotate(checkpoints_dir: Path, *, keep: int | None, best_step: int | None) -> list[int]:
    """Keep the newest `keep` checkpoints, and the best one besides (as transformers.Trainer does);
    delete the rest. The steps deleted."""
    remove_staging(checkpoints_dir)
    if keep is None:
        return []
    steps = saved_steps(checkpoints_dir)
    retained = set(steps[-keep:]) | ({best_step} if best_step is not None else set())
    doomed = [step for step in steps if step not in retained]
    for step in doomed:
        shutil.rmtree(checkpoint_path(checkpoints_dir, step), ignore_errors=True)
    return doomed


def remove_staging(checkpoints_dir: Path, *, attempt: int | None = None) -> None:
    """Remove checkpoints still being written (an attempt's own with `attempt`; else every one:
    whoever wrote them is gone or stale)."""
    tag = f".attempt-{attempt}" if attempt is not None else ""
    for leftover in checkpoints_dir.glob(f"{CHECKPOINT_PREFIX}*{tag}{PARTIAL_SUFFIX}"):
        shutil.rmtree(leftover, ignore_errors=True)


@dataclass(frozen=True)
class Reconciled:
    """The checkpoints folder set straight against what the database recorded."""

    resume_from: Path | None  # the newest declared checkpoint whose folder is complete
    removed: list[str] = field(default_factory=list)  # folders nobody declared, now deleted
    forgotten: list[int] = field(default_factory=list)  # declared steps without a complete folder


def reconcile(checkpoints_dir: Path, declared: Iterable[int], *, remove: bool = True) -> Reconciled:
    """What a new attempt resumes from, given the steps the database declared: the newest declared
    checkpoint with a complete folder. With `remove` (the main process), every folder no row
    declared is deleted — a checkpoint published but never declared, one half-written, one whose
    declaration was refused — so that nothing resumes from it, lists it, or keeps its disk; declared
    steps whose folder is missing or incomplete (rotated away before the deletion was recorded) come
    back in `forgotten`, for their rows to be deleted."""
    declared_steps = set(declared)
    complete = set(saved_steps(checkpoints_dir))
    resumable = sorted(declared_steps & complete)
    removed: list[str] = []
    if remove and checkpoints_dir.is_dir():
        for child in sorted(checkpoints_dir.iterdir()):
            if not child.is_dir() or not child.name.startswith(CHECKPOINT_PREFIX):
                continue
            step = checkpoint_step(child.name)
            if step is not None and step in resumable:
                continue
            shutil.rmtree(child, ignore_errors=True)
            removed.append(child.name)
        if removed:
            logger.info("removed checkpoint folders no attempt declared: %s", ", ".join(removed))
    return Reconciled(
        resume_from=checkpoint_path(checkpoints_dir, resumable[-1]) if resumable else None,
        removed=removed,
        forgotten=sorted(declared_steps - complete),
    )
