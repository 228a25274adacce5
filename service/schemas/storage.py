"""The answer of DELETE /v1/jobs/{id}/checkpoints."""

from __future__ import annotations

from pydantic import BaseModel, Field


class CheckpointsRemoved(BaseModel):
    job_id: int
    removed: list[str] = Field(description="The checkpoints removed, by name (checkpoint-300)")
    kept: list[str] = Field(description="The checkpoints kept, by name")
    freed_bytes: int = Field(description="Their bytes in the store, as the owner's tally counted them")
