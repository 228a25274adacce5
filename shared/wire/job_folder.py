"""A job's folder: its layout, which the worker writes, the API lists and serves, the storage
accounting sizes and prunes, and the client downloads; and the store keys built from it.

    jobs/<id>/                         the job's folder in the store (`job_key`)
      <model files>, *.tsv             the final model (or LoRA adapter), predictions
      merged/                          a LoRA job's merged model (MERGED_DIR)
      gluejobs_model_manifest.json     the model's files by hash (MANIFEST_NAME; in a checkpoint too)
      checkpoints/checkpoint-<step>/   one checkpoint (`checkpoint_path`), complete once its
                                       gluejobs_state.json (STATE_FILE) is in: written and uploaded last
      checkpoints/….partial            a checkpoint being written (PARTIAL_SUFFIX): not an artifact yet
      logs/attempt-<n>.log             each attempt's log (LOG_DIR, `attempt_log_name`)

Standard library only: the client wheel carries it (shared/wire/__init__.py).
"""

from __future__ import annotations

import re
from typing import Final

JOBS: Final = "jobs"  # the store's folder of jobs' folders: jobs/<id>/…
CHECKPOINTS: Final = "checkpoints"  # a job's checkpoints, in its folder
CHECKPOINT_PREFIX: Final = "checkpoint-"  # a checkpoint's folder: checkpoint-<step>
STATE_FILE: Final = "gluejobs_state.json"  # written last into a checkpoint: present = complete
PARTIAL_SUFFIX: Final = ".partial"  # a checkpoint folder still being written (worker/training/checkpoints.py)
LOG_DIR: Final = "logs"  # the attempts' logs, beside the checkpoints
MERGED_DIR: Final = "merged"  # a LoRA job's model with its adapter merged in (save_merged_model)
# The worker writes it beside a model's files (worker/training/model_manifest.py); the API reads it
# when a spec names the model (job:17, job:17/checkpoint-300) or a job's model is promoted.
MANIFEST_NAME: Final = "gluejobs_model_manifest.json"
# A checkpoint's step as its name spells it: at most ten digits (the API's patterns say the same).
MAX_STEP_DIGITS: Final = 10


def job_key(job_id: int, relative: str = "") -> str:
    """The store's key of job `job_id`'s folder, or of `relative` (a path with /) inside it."""
    return f"{JOBS}/{job_id}/{relative}".rstrip("/")


def checkpoint_name(step: int) -> str:
    """checkpoint-300: a checkpoint's folder, and its name in the API and the command line."""
    return f"{CHECKPOINT_PREFIX}{step}"


def checkpoint_path(step: int) -> str:
    """checkpoints/checkpoint-300: a checkpoint's folder, relative to its job's folder."""
    return f"{CHECKPOINTS}/{checkpoint_name(step)}"


def checkpoint_key(job_id: int, step: int) -> str:
    """The store's key of a job's checkpoint folder."""
    return job_key(job_id, checkpoint_path(step))


def attempt_log_name(attempt: int) -> str:
    """attempt-2.log: the log of a job's second attempt, in LOG_DIR."""
    return f"attempt-{attempt}.log"


_ATTEMPT_LOG = re.compile(r"^attempt-(\d+)\.log$")


def attempt_of_log(name: str) -> int | None:
    """The attempt whose log `name` is (attempt-2.log → 2); None for any other file."""
    match = _ATTEMPT_LOG.match(name)
    return int(match.group(1)) if match else None


def checkpoint_step(name: str) -> int | None:
    """The step of a checkpoint's folder name (checkpoint-300 → 300); None for any other name
    (a .partial folder being written, a stray file)."""
    step = name.removeprefix(CHECKPOINT_PREFIX)
    if name.startswith(CHECKPOINT_PREFIX) and step.isdigit():
        return int(step)
    return None
