"""Request and response bodies of /v1/sweeps: a grid of configurations over seeds, and its statistics."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from service.schemas.common import MAX_METADATA_KEYS, MetadataKey, MetadataValue
from shared.jobspec.spec import MAX_SEED


class SweepCreate(BaseModel):
    """One job per combination of `seeds` and `grid` values, each put into `spec`."""

    model_config = ConfigDict(extra="forbid")

    spec: dict[str, Any] = Field(description="A job spec as in POST /v1/jobs, without the swept fields")
    seeds: list[Annotated[int, Field(ge=0, le=MAX_SEED)]] = Field(
        default_factory=list, description="One job per seed and configuration, e.g. [0, 1, 2, 3, 4]"
    )
    grid: dict[str, list[Any]] = Field(
        default_factory=dict, description='Spec fields and their values, e.g. {"learning_rate": [1e-4, 5e-4]}'
    )
    priority: int = Field(default=0, ge=-1000, le=1000, description="Higher runs first")
    metadata: dict[MetadataKey, MetadataValue] = Field(
        default_factory=dict, max_length=MAX_METADATA_KEYS, description="Copied to every job of the sweep"
    )
    max_attempts: int = Field(default=3, ge=1, le=20)


class MetricSummary(BaseModel):
    median: float
    mean: float
    std: float | None = Field(description="Sample standard deviation (n−1); null for a single seed")
    min: float
    max: float
    n: int = Field(description="Seeds with this metric")


class SweepConfiguration(BaseModel):
    configuration: dict[str, Any] = Field(description="The grid values of these jobs")
    job_ids: list[int]
    seeds: list[int | None]
    job_counts: dict[str, int]
    seeds_evaluated: int = Field(description="Succeeded jobs with an evaluation: the statistics' seeds")
    best: dict[str, dict[str, MetricSummary]] = Field(
        description="At each job's best evaluation: {split: {metric: summary over seeds}}"
    )
    final: dict[str, dict[str, MetricSummary]] = Field(description="At each job's final evaluation")


class SweepWinner(BaseModel):
    configuration: dict[str, Any]
    metric: str
    median: float
    std: float | None
    seeds_evaluated: int
    job_ids: list[int]


class SweepPublic(BaseModel):
    id: int
    status: str = Field(description="queued, running, succeeded, failed or cancelled; derived from its jobs")
    spec: dict[str, Any]
    seeds: list[int]
    grid: dict[str, list[Any]]
    metadata: dict[str, Any]
    created_at: datetime
    cancel_requested_at: datetime | None
    job_ids: list[int]
    job_counts: dict[str, int]
    main_metric: str = Field(description="The metric the configurations are ranked by")
    configurations: list[SweepConfiguration] | None = Field(
        default=None, description="GET /v1/sweeps/{id}: statistics over seeds per configuration"
    )
    winner: SweepWinner | None = Field(
        default=None, description="Best median of main_metric (best evaluation)"
    )
    warnings: list[str] = Field(default_factory=list, description="Its jobs' warnings, each once")


class SweepPlanJob(BaseModel):
    configuration: str = Field(description='The combination, e.g. "learning_rate=0.0001 seed=3"')
    spec: dict[str, Any] = Field(description="The job's resolved spec, as it would be stored")
    warnings: list[str]


class SweepPlan(BaseModel):
    """POST /v1/sweeps?dry_run=true: the jobs the sweep would queue; nothing is stored."""

    dry_run: bool = True
    spec: dict[str, Any]
    grid: dict[str, list[Any]]
    seeds: list[int]
    jobs: list[SweepPlanJob]
