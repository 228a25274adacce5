"""Request and response models of /v1/searches (the space, objective, sampler and pruner models are
shared/searches/config.py's, so that the API and the driver read a search the same way)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from service.schemas.common import MAX_METADATA_KEYS, MetadataKey, MetadataValue
from shared.jobspec.spec import MAX_SEED
from shared.searches.config import MAX_PARALLELISM, MAX_TRIALS, Objective, Parameter, Pruner, Sampler

MAX_SPACE_PARAMETERS = 10
MAX_SEED_RERUNS = 20


class SearchCreate(BaseModel):
    """A base spec, a space of values for some of its fields, and how to search it."""

    model_config = ConfigDict(extra="forbid")

    spec: dict[str, Any] = Field(description="A job spec as in POST /v1/jobs, without the searched fields")
    space: dict[str, Parameter] = Field(
        max_length=MAX_SPACE_PARAMETERS,
        description='Spec fields and their ranges, e.g. {"learning_rate": {"type": "float", "low": 1e-5, '
        '"high": 1e-3, "log": true}, "per_device_train_batch_size": {"type": "categorical", "choices": '
        "[16, 32]}}",
    )
    objective: Objective = Field(default_factory=Objective)
    n_trials: int = Field(default=10, ge=1, le=MAX_TRIALS, description="The trial budget")
    parallelism: int = Field(default=2, ge=1, le=MAX_PARALLELISM, description="Trials queued at once")
    sampler: Sampler = Field(default_factory=Sampler)
    pruner: Pruner = Field(default_factory=Pruner)
    priority: int = Field(default=0, ge=-1000, le=1000, description="Every trial's priority")
    metadata: dict[MetadataKey, MetadataValue] = Field(
        default_factory=dict, max_length=MAX_METADATA_KEYS, description="Copied to every trial's job"
    )
    max_attempts: int = Field(default=3, ge=1, le=20)


class SeedsCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seeds: list[Annotated[int, Field(ge=0, le=MAX_SEED)]] = Field(
        min_length=1, max_length=MAX_SEED_RERUNS, description="Re-run the best trial once per seed"
    )


class SearchTrialPublic(BaseModel):
    number: int
    job_id: int | None
    job_status: str | None = Field(description="Its job's status")
    state: str = Field(description="running, complete, pruned or failed")
    params: dict[str, Any]
    value: float | None = Field(description="Its best evaluation of the objective (complete trials)")
    intermediate: dict[str, float] = Field(description="{evaluation number: objective value}")
    pruned: dict[str, Any] | None = Field(
        description="Where the pruner stopped it: {evaluation, epoch, step, metric, value, pruner}"
    )
    created_at: datetime
    finished_at: datetime | None


class SearchBest(BaseModel):
    number: int
    job_id: int | None
    params: dict[str, Any]
    value: float


class SearchSavings(BaseModel):
    """The compute pruning saved: optimizer steps, over the trials that completed or were pruned."""

    pruned_trials: int
    steps_planned: int = Field(description="The steps those trials' training loops planned to run")
    steps_run: int = Field(description="The steps they ran (a pruned trial: until its worker stopped it)")
    steps_saved: int = Field(description="steps_planned - steps_run: what the pruned trials did not run")
    saved_share: float | None = Field(description="steps_saved / steps_planned")
    trials_unknown: int = Field(
        description="Ended trials left out: their plan is not known (training never started, no "
        "max_train_steps)"
    )


class SearchSeeds(BaseModel):
    sweep_id: int
    seeds: list[int]
    status: str
    job_ids: list[int]
    values: list[float | None] = Field(description="Each seed's best evaluation of the objective")
    median: float | None = Field(description="Median over the seeds that finished")


class SearchPublic(BaseModel):
    id: int
    status: str = Field(description="running, succeeded, failed or cancelled")
    spec: dict[str, Any] = Field(description="The trials' resolved spec without the searched fields")
    space: dict[str, Any]
    objective: dict[str, Any] = Field(description="{metric, direction}, defaults filled in")
    n_trials: int
    parallelism: int
    sampler: dict[str, Any]
    pruner: dict[str, Any]
    sampler_seed: int
    metadata: dict[str, Any]
    created_at: datetime
    finished_at: datetime | None
    cancel_requested_at: datetime | None
    note: str | None = Field(description="Why it waits (a full queue), or why it stopped early")
    trial_counts: dict[str, int]
    job_ids: list[int]
    best: SearchBest | None
    trials: list[SearchTrialPublic] | None = Field(default=None, description="GET /v1/searches/{id}")
    seeds: SearchSeeds | None = Field(default=None, description="The best trial re-run over seeds")
    savings: SearchSavings | None = Field(
        default=None, description="GET /v1/searches/{id}: what pruning saved"
    )
