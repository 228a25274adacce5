"""Request and response bodies of /v1/jobs: a job to create, a job as the API shows it, a dry run's plan."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, computed_field

from service.schemas.common import (
    MAX_METADATA_KEY_CHARS,
    MAX_METADATA_KEYS,
    MAX_METADATA_VALUE_CHARS,
    MetadataKey,
    MetadataValue,
)
from service.schemas.files import DataFile, data_files
from shared.core.tables import JobStatus
from shared.jobspec.spec import JobSpec
from shared.jobspec.tasks import EVAL_SPLIT, TASKS


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


class WaitingFor(BaseModel):
    """Why a queued job is held back (shared/scheduling/wait_reasons.py)."""

    reason: Literal["quota", "storage", "reservation", "devices", "retry_backoff", "build"]
    message: str = Field(description="e.g. alice holds 1 of 1 devices (max_devices)")


class JobPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    status: JobStatus
    owner: str | None = Field(
        default=None, description="The owner whose key created it (a person or a team); null without auth"
    )
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
    error_code: str | None = Field(
        default=None,
        description="Why it failed: invalid_data, model_load_failed, timeout, internal (not retried); "
        "out_of_memory, killed, device_error, database_unreachable, worker_lost (retried while attempts "
        "remain). A queued job keeps its last attempt's code",
    )
    not_before: datetime | None = Field(
        default=None, description="A retried job is not claimed before this time (backoff)"
    )
    output_dir: str | None = Field(
        description="The job's files: their API path, /v1/jobs/{id}/artifacts (GET lists them; `gluejobs "
        "download ID DIR` fetches the model); for an admin key, where the worker stored them (its folder "
        "or the store's URI)"
    )
    latest_metrics: dict[str, Any] = Field(description="Per split, the newest value of each metric")
    best_metrics: dict[str, Any] | None = Field(description="The best evaluation by metric_for_best_model")
    result: dict[str, Any] | None = Field(
        description="Parameter counts, throughput, peak memory …; `model_dir` is the final model's API "
        "path (an admin key: the worker's folder)"
    )
    sweep_id: int | None = Field(default=None, description="The sweep this job is one combination of")
    search_id: int | None = Field(default=None, description="The search this job is a trial of")
    pruned: dict[str, Any] | None = Field(
        default=None,
        description="A trial its search's pruner stopped (status cancelled, error_code pruned): where, "
        "{search_id, trial, evaluation, epoch, step, metric, value, pruner}",
    )
    rerun_of: int | None = Field(
        default=None, description="The job this one repeats (POST /v1/jobs/{id}/rerun)"
    )
    environment: dict[str, Any] | None = Field(
        default=None,
        description="Reproducibility record of the latest attempt: versions, device, sha256 of data and "
        "weights (each file named as the spec names it; an admin key: its path on the worker), the "
        "resolved spec",
    )
    waiting_for: WaitingFor | None = Field(
        default=None,
        description="A queued job held back: its owner's quota, a reservation, devices no worker has "
        "free, or a retry's backoff; null otherwise",
    )
    reproduction: dict[str, Any] | None = Field(
        default=None,
        description="A rerun, in GET /v1/jobs/{id}: whether its metrics matched the original's (exact, or "
        "within the stated tolerance) and what differs in the two records",
    )
    warnings: Annotated[list[str], BeforeValidator(lambda value: value or [])] = Field(
        default_factory=list,
        description="What the API accepted but you should know, from when the job was created: a model "
        "it could not check, a label that looks like a typo of another …",
    )

    @computed_field(description="The data files the spec names: name, and for uploaded files size and sha256")  # type: ignore[prop-decorator]
    @property
    def data_files(self) -> list[DataFile]:
        return data_files(self.spec)

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


class JobPlan(BaseModel):
    """POST /v1/jobs?dry_run=true: what the job would do, found without a GPU; nothing is stored."""

    dry_run: bool = True
    # First, so that a reader of the answer sees them before the spec's many lines.
    warnings: list[str] = Field(
        description="What would run but probably not as meant, each `field: message`: near-duplicate "
        "labels, rare classes, imbalance, rows that will be truncated, options that another overrides …"
    )
    spec: dict[str, Any] = Field(description="The resolved spec, as it would be stored")
    data: dict[str, Any] = Field(description="Per split: source, rows, rows used, counts per label")
    schedule: dict[str, Any] = Field(description="Steps per epoch, optimizer steps, warmup, evaluations")
    tokens: dict[str, Any] = Field(description="Longest and mean tokenised lengths; padding per scheme")
    memory: dict[str, Any] = Field(description="Estimated worker memory for the model, batch and precision")
