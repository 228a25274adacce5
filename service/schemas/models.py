"""Response bodies of /v1/models."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from shared.core.tables import StoredModel
from shared.jobspec.job_sources import JobSource
from shared.jobspec.registered_models import NAME_PATTERN, ManifestFile, reference
from shared.wire.job_folder import CHECKPOINT_PREFIX


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


class ModelPromote(BaseModel):
    """POST /v1/jobs/{id}/model: register the job's model as `model:NAME`."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        pattern=NAME_PATTERN,
        description="The model's name: letters, digits, '.', '_' and '-', at most 64, starting with a "
        "letter or digit; a job then names it model:NAME",
    )
    checkpoint: str | None = Field(
        default=None,
        pattern=r"^(best|checkpoint-[0-9]{1,10}|[0-9]{1,10})$",
        description="One of the job's declared checkpoints (checkpoint-300, or the step: 300) or `best` "
        "(its best by its ranking metric); null: the job's final model",
        examples=["best", "checkpoint-300"],
    )

    def source(self, job_id: int) -> JobSource:
        if self.checkpoint is None:
            return JobSource(job_id)
        if self.checkpoint == "best":
            return JobSource(job_id, best=True)
        return JobSource(job_id, step=int(self.checkpoint.removeprefix(CHECKPOINT_PREFIX)))
