"""Request and response bodies of the HTTP API."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, computed_field

from shared.models import JobStatus
from shared.spec import JobSpec
from shared.tasks import EVAL_SPLIT, TASKS

T = TypeVar("T")

MAX_METADATA_KEYS = 32
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512

# Constraints in the types (not in a validator) so the schema documents them and an error names the
# offending key: `metadata.<key>`.
MetadataKey = Annotated[str, Field(min_length=1, max_length=MAX_METADATA_KEY_CHARS)]
MetadataValue = Annotated[str, Field(max_length=MAX_METADATA_VALUE_CHARS)]


class JobCreate(BaseModel):
    """A job to run: the script's arguments under `spec`, plus queue options."""

    model_config = ConfigDict(extra="forbid")

    spec: JobSpec
    priority: int = Field(default=0, ge=-1000, le=1000, description="Higher runs first")
    metadata: dict[MetadataKey, MetadataValue] = Field(
        default_factory=dict,
        max_length=MAX_METADATA_KEYS,
        description=f"Your own labels, returned as given: at most {MAX_METADATA_KEYS} keys of 1 to "
        f"{MAX_METADATA_KEY_CHARS} characters, values of at most {MAX_METADATA_VALUE_CHARS} characters",
    )
    max_attempts: int = Field(default=3, ge=1, le=20, description="Runs before a job whose worker died fails")


class HeadlineMetric(BaseModel):
    name: str
    value: float | None = Field(description="The newest evaluation's value")
    best: float | None = Field(description="The best evaluation's value")


class JobPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    status: JobStatus
    spec: dict[str, Any] = Field(description="The resolved spec: defaults filled in, seed recorded")
    priority: int
    metadata: dict[str, Any] = Field(validation_alias="metadata_")
    attempts: int
    max_attempts: int
    worker_id: str | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    cancel_requested_at: datetime | None
    error: str | None
    output_dir: str | None
    latest_metrics: dict[str, Any] = Field(description="Per split, the newest value of each metric")
    best_metrics: dict[str, Any] | None = Field(description="The best evaluation by metric_for_best_model")
    result: dict[str, Any] | None = Field(description="Parameter counts, throughput, peak memory …")

    @computed_field(description="The task's main metric: its newest evaluation and its best")  # type: ignore[prop-decorator]
    @property
    def headline_metric(self) -> HeadlineMetric | None:
        task = TASKS.get(str(self.spec.get("task_name") or ""))
        name = task.main_metric if task else (self.best_metrics or {}).get("metric")
        if name is None:
            return None
        latest = (self.latest_metrics.get(EVAL_SPLIT) or {}).get(name)
        best = (
            self.best_metrics["value"]
            if self.best_metrics and self.best_metrics.get("metric") == name
            else None
        )
        return HeadlineMetric(name=name, value=latest, best=best)


class Page(BaseModel, Generic[T]):
    data: list[T]
    has_more: bool
    next_cursor: str | None = Field(description="Pass as `after` for the next page")


class MetricPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    epoch: float
    step: int
    split: str = Field(description="train, eval or eval_mismatched")
    name: str
    value: float
    created_at: datetime


class CheckpointPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    epoch: float
    step: int
    path: str
    metrics: dict[str, Any]
    created_at: datetime
    is_best: bool


class CheckpointList(BaseModel):
    data: list[CheckpointPublic]


class EventPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    created_at: datetime
    kind: str = Field(description="state (a status change), log, or checkpoint")
    level: str
    message: str
    data: dict[str, Any] | None


class ErrorBody(BaseModel):
    code: str
    message: str
    field: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


class Health(BaseModel):
    status: str
    database: str | None = None
    detail: str | None = None


class ArtifactPublic(BaseModel):
    path: str = Field(description="Relative to the job's folder; GET /v1/jobs/{id}/artifacts/{path}")
    size: int = Field(description="Bytes")
    modified: datetime
    kind: str = Field(description="model, checkpoint, predictions, log or other")


class ArtifactList(BaseModel):
    data: list[ArtifactPublic]
