"""The files of a job's folder: GET /v1/jobs/{id}/artifacts."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class ArtifactPublic(BaseModel):
    path: str = Field(description="Relative to the job's folder; GET /v1/jobs/{id}/artifacts/{path}")
    size: int = Field(description="Bytes")
    modified: datetime
    kind: str = Field(description="model, checkpoint, predictions, log or other")


class ArtifactList(BaseModel):
    data: list[ArtifactPublic]
