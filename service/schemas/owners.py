"""Bodies of /v1/owners: what each owner holds and may hold, and the admins' change of it."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

from shared.core.owners import OWNER_NAME_SCHEMA, valid_owner_name

# Every route that takes an owner's name takes it through these (shared/core/owners.valid_owner_name).
OwnerName = Annotated[str, AfterValidator(valid_owner_name), WithJsonSchema(OWNER_NAME_SCHEMA)]


class OwnerQuota(BaseModel):
    max_devices: int | None = Field(description="Devices held at once (null: no limit)")
    max_queued: int | None = Field(description="Queued jobs (null: no limit)")
    max_device_hours_per_day: float | None = Field(
        description="Device-hours in any 24 hours (null: no limit)"
    )
    max_storage_bytes: int | None = Field(
        description="Bytes held in the store: files, models, checkpoints, job outputs (null: no limit)"
    )


class OwnerQuotaSource(BaseModel):
    max_devices: str = Field(description='"owner" (set by an admin) or "default" (the configuration)')
    max_queued: str
    max_device_hours_per_day: str
    max_storage_bytes: str


class OwnerStorage(BaseModel):
    """What an owner holds in the store, from the database's tally: sized by the API's storage sweep
    (GLUEJOBS_STORAGE_SWEEP_S) once a checkpoint is declared and once a job has finished."""

    files_bytes: int = Field(description="Its uploaded files (each upload counts)")
    models_bytes: int = Field(description="Its registered models")
    checkpoints_bytes: int = Field(description="Its jobs' declared checkpoints")
    outputs_bytes: int = Field(description="Its finished jobs' other files: final model, predictions, logs")
    total_bytes: int = Field(description="The sum: what max_storage_bytes is compared with")


class OwnerPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    name: str
    share: float = Field(description="Fair share's weight (default 1)")
    running_jobs: int
    devices_in_use: int = Field(description="The sum of num_processes × num_machines of its running jobs")
    queued_jobs: int
    device_hours_24h: float = Field(description="Device-hours its jobs used in the last 24 hours")
    quota: OwnerQuota = Field(description="The effective limits, defaults applied")
    quota_source: OwnerQuotaSource
    storage: OwnerStorage = Field(description="Bytes it holds in the store, by kind")


class OwnersPublic(BaseModel):
    data: list[OwnerPublic]


class OwnerUpdate(BaseModel):
    """Fields to change; a field given as null goes back to the default (share: 1); one left out
    stays as it is."""

    model_config = ConfigDict(extra="forbid")

    # strict: `true` is not a limit of 1 (pydantic's lax mode reads a boolean as 0 or 1), nor 2.0 a
    # count; numbers stay numbers (found by the schema fuzz).
    share: float | None = Field(default=None, gt=0, le=1000, strict=True, description="Fair share's weight")
    max_devices: int | None = Field(default=None, ge=0, le=100_000, strict=True)
    max_queued: int | None = Field(default=None, ge=0, le=10_000_000, strict=True)
    max_device_hours_per_day: float | None = Field(default=None, ge=0, le=1e9, strict=True)
    max_storage_bytes: int | None = Field(default=None, ge=0, le=2**62, strict=True)
