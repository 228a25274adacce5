"""Checkpoint folders: atomic saves, rotation (save_total_limit), and the state a resumed run needs.

A checkpoint folder is also a model, as Trainer's are: the model's `from_pretrained` files (for LoRA,
the adapter) and the tokenizer, beside Accelerate's optimizer, scheduler and RNG states and
`gluejobs_state.json`.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

CHECKPOINT_PREFIX = "checkpoint-"
STATE_FILE = "gluejobs_state.json"


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
    return checkpoints_dir / f"{CHECKPOINT_PREFIX}{step}"


def staging_path(final: Path) -> Path:
    """Where a checkpoint is written before it is renamed into place, so a crash mid-save leaves
    no half-written checkpoint behind to resume from."""
    return final.with_name(final.name + ".partial")


def publish(staging: Path, final: Path) -> None:
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)


def is_complete(folder: Path) -> bool:
    return folder.is_dir() and (folder / STATE_FILE).is_file()


def saved_steps(checkpoints_dir: Path) -> list[int]:
    if not checkpoints_dir.is_dir():
        return []
    steps = []
    for child in checkpoints_dir.iterdir():
        suffix = child.name.removeprefix(CHECKPOINT_PREFIX)
        if child.name.startswith(CHECKPOINT_PREFIX) and suffix.isdigit() and is_complete(child):
            steps.append(int(suffix))
    return sorted(steps)


def newest_checkpoint(checkpoints_dir: Path) -> Path | None:
    steps = saved_steps(checkpoints_dir)
    return checkpoint_path(checkpoints_dir, steps[-1]) if steps else None


def rotate(checkpoints_dir: Path, *, keep: int | None, best_step: int | None) -> list[int]:
    """Keep the newest `keep` checkpoints, and the best one besides (as transformers.Trainer does);
    delete the rest. The steps deleted."""
    for leftover in checkpoints_dir.glob(f"{CHECKPOINT_PREFIX}*.partial"):
        shutil.rmtree(leftover, ignore_errors=True)
    if keep is None:
        return []
    steps = saved_steps(checkpoints_dir)
    retained = set(steps[-keep:]) | ({best_step} if best_step is not None else set())
    doomed = [step for step in steps if step not in retained]
    for step in doomed:
        shutil.rmtree(checkpoint_path(checkpoints_dir, step), ignore_errors=True)
    return doomed
