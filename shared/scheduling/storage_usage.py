"""What each owner holds in the store, from the database's tally (never a walk of the store): the
bytes of its uploaded files (files.bytes), registered models (models.bytes), its jobs' checkpoints
(checkpoints.bytes) and its finished jobs' other files (jobs.output_bytes: model, predictions, logs).

Checkpoint and output sizes are written by the API's storage sweep (shared/jobs_repo/storage_usage.py)
once the checkpoint is declared or the job has finished, so the tally trails the store by at most a
sweep (GLUEJOBS_STORAGE_SWEEP_S). Each row counts as its owner's: a file uploaded twice counts twice,
though the store keeps its bytes once.

One statement, however many owners and jobs: four grouped sums in a UNION ALL, each read through an
owner index (ix_files_owner_id, ix_models_owner_id, ix_jobs_owner_id, and checkpoints' (job_id, step)
key for the join).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, literal, select, union_all
from sqlalchemy.orm import Session

from shared.core.tables import (
    CheckpointSize,
    File,
    JobOutputSize,
    OwnerStorageQuota,
    StoredModel,
)

KINDS = ("files", "models", "checkpoints", "outputs")


@dataclass(frozen=True)
class StorageUsage:
    """An owner's bytes in the store, by kind."""

    files: int = 0
    models: int = 0
    checkpoints: int = 0
    outputs: int = 0

    @property
    def total(self) -> int:
        return self.files + self.models + self.checkpoints + self.outputs

    def as_dict(self) -> dict[str, int]:
        return {
            "files_bytes": self.files,
            "models_bytes": self.models,
            "checkpoints_bytes": self.checkpoints,
            "outputs_bytes": self.outputs,
            "total_bytes": self.total,
        }


def storage_by_owner(session: Session, owners: Collection[str] | None = None) -> dict[str, StorageUsage]:
    """owner → its bytes by kind (only owners holding something; jobs and files without an owner, auth
    off, are nobody's). With `owners`, only those."""
    names = None if owners is None else list(owners)
    if names is not None and not names:
        return {}

    # What each kind's bytes are summed from: one owner-indexed table each.
    tallies = (
        (File, "files"),
        (StoredModel, "models"),
        (CheckpointSize, "checkpoints"),
        (JobOutputSize, "outputs"),
    )
    parts = []
    for table, kind in tallies:
        owner: Any = table.owner
        part = select(owner.label("owner"), literal(kind).label("kind"), func.sum(table.bytes).label("bytes"))
        part = part.where(owner.is_not(None))
        if names is not None:
            part = part.where(owner.in_(names))
        parts.append(part.group_by(owner))
    sums: dict[str, dict[str, int]] = {}
    for owner, kind, total in session.execute(union_all(*parts)).tuples():
        if owner is not None and total:
            sums.setdefault(str(owner), {})[str(kind)] = int(total)
    return {owner: StorageUsage(**kinds) for owner, kinds in sums.items()}


def own_storage_limits(session: Session, owners: Collection[str] | None = None) -> dict[str, int]:
    """owner → the max_storage_bytes an admin set for it (owners without one: the default)."""
    query = select(OwnerStorageQuota.owner, OwnerStorageQuota.max_storage_bytes).where(
        OwnerStorageQuota.max_storage_bytes.is_not(None)
    )
    if owners is not None:
        query = query.where(OwnerStorageQuota.owner.in_(list(owners)))
    return {str(owner): int(limit) for owner, limit in session.execute(query) if limit is not None}


def human_bytes(count: int | float) -> str:
    """1536 → "1.5 KiB": sizes in words (quota messages, the CLI)."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
