"""Request and response bodies of the HTTP API."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, computed_field

from service.schemas.files import DataFile, data_files
from shared.core.tables import JobStatus
from shared.jobspec.spec import MAX_SEED, JobSpec
from shared.jobspec.tasks import EVAL_SPLIT, TASKS

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


class WorkerJob(BaseModel):
    id: int
    attempt: int
    status: JobStatus
    devices: list[str] | None = Field(description="The devices the attempt holds (CUDA indices, CPU slots)")


class WorkerPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    host: str
    pid: int
    version: str | None
    devices: list[str] = Field(description="What the worker runs jobs on: CUDA indices or CPU slots")
    state: str = Field(
        description="idle, busy, low_disk (below its free-space floor: takes no work until it has room), "
        "draining (stopping: takes no work, hands its jobs back), stopped (said goodbye), or gone (no "
        "heartbeat for a lease, without a goodbye)"
    )
    started_at: datetime
    last_heartbeat_at: datetime
    stopped_at: datetime | None
    jobs: list[WorkerJob] = Field(
        description="The jobs it runs now (with a normal key: only that key's own jobs)"
    )


class WorkersPublic(BaseModel):
    data: list[WorkerPublic]


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
    path: str | None = Field(
        default=None,
        description="Its API path, /v1/jobs/{id}/artifacts/checkpoints/checkpoint-{step} (a GET answers a "
        "tar stream); for an admin key, where the worker stored it (its folder, or the store's URI). Not "
        "in the live stream's checkpoint messages, whose readers fetch it with `download`",
    )
    download: str | None = Field(default=None, description="The command that downloads it to a folder DIR")
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


class ProblemPublic(BaseModel):
    """One problem a check found (or one warning): where, a code a program can act on, a sentence."""

    field: str = Field(description="Where: spec.learning_rate, spec.train_file, file, priority …")
    code: str = Field(
        description="unknown_field, required, wrong_type, out_of_range, not_allowed, invalid_value, "
        "invalid_spec, invalid_data, not_found …; warnings: label_near_duplicate, rare_class, "
        "label_imbalance, long_rows …"
    )
    message: str


class ErrorBody(BaseModel):
    code: str
    message: str = Field(description="The first problem (with how many more there are)")
    field: str | None = Field(default=None, description="The first problem's field")
    errors: list[ProblemPublic] | None = Field(
        default=None,
        description="422: every problem found, the first as `field`/`message`; at most 50 (`errors_omitted` "
        "counts the rest)",
    )
    errors_omitted: int | None = Field(default=None, description="Problems found beyond those listed")
    warnings: list[ProblemPublic] | None = Field(
        default=None, description="What passed with a word of warning beside the refusal"
    )


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


# ---------------------------------------------------------------------------------------------------
# Sweeps
# ---------------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------------
# Leaderboard
# ---------------------------------------------------------------------------------------------------


class BaselinePublic(BaseModel):
    metric: str
    value: float = Field(description="main metric of always predicting the majority class")
    majority_label: str | None
    share: float | None = Field(description="The majority class's share of the rows")
    rows: int
    where: str


class LeaderboardEntry(BaseModel):
    rank: int
    kind: str = Field(description="job or sweep")
    id: int
    value: float = Field(description="main metric at the best evaluation (a sweep: median over seeds)")
    final_value: float | None = Field(description="main metric at the final evaluation (a sweep: median)")
    std: float | None = Field(description="a sweep: standard deviation over seeds")
    seeds: int
    model: str
    recipe: str
    hyperparameters: dict[str, Any]
    trainable_params: int | None
    configuration: dict[str, Any] | None = Field(description="a sweep: its winning grid values")
    job_ids: list[int]
    baseline: BaselinePublic | None = Field(description="majority class on the rows this entry evaluated on")
    near_chance: bool | None = Field(description="Less than one point above its majority-class baseline")


class TaskLeaderboard(BaseModel):
    task: str
    metric: str
    baseline: BaselinePublic | None = Field(description="majority class on the task's whole dev set")
    entries: list[LeaderboardEntry]


class Leaderboard(BaseModel):
    data: list[TaskLeaderboard]
    near_chance_margin: float = Field(description="In the metric's units: 0.01 is one GLUE point")
