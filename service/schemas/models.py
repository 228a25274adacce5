"""Response bodies of /v1/models (beside service/schemas/jobs.py, which holds the others)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from shared.core.tables import StoredModel
from shared.jobspec.registered_models import ManifestFile, reference


class ModelPublic(BaseModel):
    """A registered model: its name, what a job spec names it by, and its files by hash."""

    name: str
    owner: str | None
    model_name_or_path: str = Field(
        description="Name it so in a job spec: model:NAME (model:OWNER/NAME for another owner's, admins)"
    )
    model_type: str = Field(description="config.json's model_type")
    sha256: str = Field(
        description="The sha256 of its manifest (its files' paths and hashes): the model's hash"
    )
    bytes: int = Field(description="Its files' size together")
    files: list[ManifestFile]
    created_at: datetime

    @classmethod
    def of(cls, model: StoredModel, *, caller: str | None) -> ModelPublic:
        return cls(
            name=model.name,
            owner=model.owner,
            model_name_or_path=reference(model.name, None if model.owner == caller else model.owner),
            model_type=model.model_type,
            sha256=model.sha256,
            bytes=model.bytes,
            files=[ManifestFile.model_validate(entry) for entry in model.files],
            created_at=model.created_at,
        )


class ModelDeleted(BaseModel):
    name: str
    deleted: bool = True
