"""What the client hands back: ApiError for every failure, and typed results built from the API's
JSON answers (the documented fields typed, the whole answer kept in `raw`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, TypeVar

from shared.wire import vocabulary

# A job's finished statuses, as the API spells them (shared/wire/vocabulary.py is their one home):
# plain strings, as `Job.status` holds them.
TERMINAL_STATUSES: frozenset[str] = frozenset(status.value for status in vocabulary.TERMINAL_STATUSES)


@dataclass(frozen=True)
class Problem:
    """One problem the API found (`error.errors`), or one warning (`warnings` of an upload)."""

    field: str
    code: str
    message: str

    def line(self) -> str:
        """`field: message`, the one-line form the command prints."""
        return self.message if self.message.startswith(f"{self.field}: ") else f"{self.field}: {self.message}"

    @classmethod
    def parse(cls, items: Any) -> list[Problem]:
        """The problems of an answer's list, skipping what is not one (a newer API's other shapes)."""
        if not isinstance(items, list):
            return []
        return [
            cls(str(item.get("field") or ""), str(item.get("code") or ""), str(item.get("message") or ""))
            for item in items
            if isinstance(item, Mapping)
        ]


class ApiError(Exception):
    """An error answer of the API (`{"error": {"code", "message", "field"?, "errors"?}}`) with its
    status code, or status_code 0 where no usable answer came: `unreachable` (no answer at all), or
    an answer the client refuses to act on — `unsafe_path` (a download path that leaves its folder),
    `answer_too_large`, `invalid_answer`. A 422 carries every problem the API found (`problems`, the
    first also as `field`/`message`), how many more it did not list (`problems_omitted`), and the
    warnings it answered beside them."""

    def __init__(
        self,
        status_code: int,
        code: str,
        message: str,
        field: str | None = None,
        *,
        problems: list[Problem] | None = None,
        problems_omitted: int = 0,
        warnings: list[Problem] | None = None,
    ) -> None:
        self.status_code = status_code
        self.code = code
        self.message = message
        self.field = field
        self.problems = problems or []
        self.problems_omitted = problems_omitted
        self.warnings = warnings or []
        where = f" ({field})" if field else ""
        super().__init__(
            f"{status_code} {code}{where}: {message}" if status_code else f"{code}{where}: {message}"
        )


R = TypeVar("R", bound="Result")


@dataclass(frozen=True)
class Result:
    """A result built from an API answer: the documented fields typed, everything in `raw`, so
    fields a newer API adds are never lost."""

    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls: type[R], body: Mapping[str, Any]) -> R:
        if not isinstance(body, Mapping):
            raise ApiError(
                0, "invalid_answer", f"expected a JSON object for {cls.__name__}, got {body!r:.80}"
            )
        values: dict[str, Any] = {"raw": dict(body)}
        for item in fields(cls):
            if item.name == "raw" or item.name not in body:
                continue
            value = body[item.name]
            if isinstance(value, str) and item.name.endswith(("_at", "modified")):
                value = _timestamp(cls.__name__, item.name, value)
            values[item.name] = value
        return cls(**values)


def _timestamp(kind: str, name: str, value: str) -> datetime:
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise ApiError(0, "invalid_answer", f"{kind}.{name} is not a timestamp: {value!r:.80}") from None


@dataclass(frozen=True)
class Job(Result):
    id: int = 0
    status: str = ""
    spec: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)
    attempts: int = 0
    max_attempts: int = 0
    worker_id: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    cancel_requested_at: datetime | None = None
    error: str | None = None
    error_code: str | None = None
    output_dir: str | None = None  # /v1/jobs/N/artifacts (an admin key: the worker's folder or store URI)
    latest_metrics: dict[str, Any] = field(default_factory=dict)
    best_metrics: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    headline_metric: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)
    sweep_id: int | None = None
    rerun_of: int | None = None
    reproduction: dict[str, Any] | None = None
    # A queued job held back: {"reason": quota|storage|reservation|devices|retry_backoff|build, "message": …}.
    waiting_for: dict[str, str] | None = None

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL_STATUSES


@dataclass(frozen=True)
class Plan(Result):
    """A dry run's answer (`jobs.dry_run`): what the job would do; nothing was stored."""

    spec: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    schedule: dict[str, Any] = field(default_factory=dict)
    tokens: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Sweep(Result):
    id: int = 0
    status: str = ""
    spec: dict[str, Any] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=list)
    grid: dict[str, list[Any]] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    created_at: datetime | None = None
    cancel_requested_at: datetime | None = None
    job_ids: list[int] = field(default_factory=list)
    job_counts: dict[str, int] = field(default_factory=dict)
    main_metric: str = ""
    configurations: list[dict[str, Any]] | None = None  # `sweeps.get` only: statistics over seeds
    winner: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Search(Result):
    """A hyperparameter search (`client.searches`): its trials are jobs; `trials` in `get` only."""

    id: int = 0
    status: str = ""
    spec: dict[str, Any] = field(default_factory=dict)
    space: dict[str, Any] = field(default_factory=dict)
    objective: dict[str, Any] = field(default_factory=dict)
    n_trials: int = 0
    parallelism: int = 0
    sampler: dict[str, Any] = field(default_factory=dict)
    pruner: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    created_at: datetime | None = None
    finished_at: datetime | None = None
    note: str | None = None
    trial_counts: dict[str, int] = field(default_factory=dict)
    job_ids: list[int] = field(default_factory=list)
    best: dict[str, Any] | None = None  # {number, job_id, params, value}
    trials: list[dict[str, Any]] | None = None
    seeds: dict[str, Any] | None = None  # the best trial re-run over seeds: {sweep_id, values, median …}


@dataclass(frozen=True)
class SweepPlan(Result):
    """A sweep's dry run (`sweeps.dry_run`): each combination's resolved spec; nothing was stored."""

    spec: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, list[Any]] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=list)
    jobs: list[dict[str, Any]] = field(default_factory=list)  # {configuration, spec, warnings}


@dataclass(frozen=True)
class TaskLeaderboard(Result):
    """One task's board: entries ranked by its main metric, beside its majority-class baseline."""

    task: str = ""
    metric: str = ""
    baseline: dict[str, Any] | None = None
    entries: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Metric(Result):
    id: int = 0
    epoch: float = 0.0
    step: int = 0
    split: str = ""
    name: str = ""
    value: float = 0.0
    created_at: datetime | None = None


@dataclass(frozen=True)
class Event(Result):
    id: int = 0
    created_at: datetime | None = None
    kind: str = ""
    level: str = ""
    message: str = ""
    data: dict[str, Any] | None = None


@dataclass(frozen=True)
class Checkpoint(Result):
    epoch: float = 0.0
    step: int = 0
    # Its folder's API path (/v1/jobs/N/artifacts/checkpoints/checkpoint-S); for an admin key the
    # worker's folder or the store's URI. Not in live streams' checkpoint messages.
    path: str | None = None
    download: str | None = None  # the command that downloads it
    metrics: dict[str, Any] = field(default_factory=dict)
    created_at: datetime | None = None
    is_best: bool = False


@dataclass(frozen=True)
class Artifact(Result):
    path: str = ""
    size: int = 0
    modified: datetime | None = None
    kind: str = ""


@dataclass(frozen=True)
class WorkerInfo(Result):
    id: str = ""
    host: str = ""
    pid: int = 0
    version: str | None = None
    devices: list[str] = field(default_factory=list)
    state: str = ""  # idle, busy, draining, stopped, or gone (no heartbeat for a lease)
    started_at: datetime | None = None
    last_heartbeat_at: datetime | None = None
    stopped_at: datetime | None = None
    jobs: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class OwnerInfo(Result):
    """An owner in GET /v1/owners: what it holds, queues and used, and its effective quota."""

    name: str = ""
    share: float = 1.0
    running_jobs: int = 0
    devices_in_use: int = 0
    queued_jobs: int = 0
    device_hours_24h: float = 0.0
    # max_devices, max_queued, max_device_hours_per_day, max_storage_bytes
    quota: dict[str, Any] = field(default_factory=dict)
    quota_source: dict[str, str] = field(default_factory=dict)  # each: "owner" or "default"
    # Bytes held in the store: files_bytes, models_bytes, checkpoints_bytes, outputs_bytes, total_bytes.
    storage: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckpointsRemoved(Result):
    """The answer of DELETE /v1/jobs/{id}/checkpoints (`client.jobs.prune_checkpoints`)."""

    job_id: int = 0
    removed: list[str] = field(default_factory=list)  # checkpoint names: checkpoint-300
    kept: list[str] = field(default_factory=list)
    freed_bytes: int = 0


@dataclass(frozen=True)
class StreamEvent:
    """One Server-Sent Event of /v1/jobs/{id}/stream: `event` is metric, checkpoint, status, event,
    log or end; `data` its decoded JSON; `id` the cursor to resume after it; `row` the typed row
    (a Metric, a Checkpoint, or an Event for status and event; None for log and end, whose `data`
    is `{attempt, text}` and `{status}`)."""

    event: str
    data: Any
    id: str | None

    @property
    def row(self) -> Metric | Checkpoint | Event | None:
        kind = _STREAM_ROWS.get(self.event)
        return kind.from_json(self.data) if kind is not None and isinstance(self.data, Mapping) else None


_STREAM_ROWS: dict[str, type[Metric] | type[Checkpoint] | type[Event]] = {
    "metric": Metric,
    "checkpoint": Checkpoint,
    "status": Event,
    "event": Event,
}


@dataclass(frozen=True)
class FileInfo(Result):
    """An uploaded data file (POST /v1/files): name it in a spec by its `id`."""

    id: str = ""
    filename: str = ""
    format: str = ""
    purpose: str = ""
    task_name: str | None = None
    bytes: int = 0
    sha256: str = ""
    rows: int = 0
    columns: list[str] = field(default_factory=list)
    checks: dict[str, Any] = field(default_factory=dict)
    warnings: list[dict[str, Any]] = field(default_factory=list)  # {field, code, message}: see problems
    created_at: datetime | None = None

    @property
    def warning_problems(self) -> list[Problem]:
        """The upload's warnings (near-duplicate labels, rare classes, imbalance, long rows), typed."""
        return Problem.parse(self.warnings)


@dataclass(frozen=True)
class ModelInfo(Result):
    """A registered model (POST /v1/models): name it in a spec by its `model_name_or_path`
    (`model:NAME`)."""

    name: str = ""
    owner: str | None = None
    model_name_or_path: str = ""
    model_type: str = ""
    sha256: str = ""
    bytes: int = 0
    files: list[dict[str, Any]] = field(default_factory=list)
    created_at: datetime | None = None


@dataclass(frozen=True)
class ApiKeyInfo(Result):
    """A key made over the API (`client.keys`): `secret` is set only in the answer that made it
    (create, rotate), and is shown nowhere else."""

    id: int = 0
    name: str = ""
    owner: str = ""
    role: str = ""
    prefix: str = ""
    created_at: datetime | None = None
    created_by: str | None = None
    last_used_at: datetime | None = None
    expires_at: datetime | None = None
    revoked_at: datetime | None = None
    rotated_from: int | None = None
    secret: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Webhook(Result):
    """A webhook endpoint (`client.webhooks`): `secret` is set only in the answers of create and
    rotate, and is shown nowhere else."""

    id: int = 0
    owner: str | None = None
    url: str = ""
    event_types: list[str] = field(default_factory=list)
    description: str | None = None
    disabled: bool = False
    created_at: datetime | None = None
    updated_at: datetime | None = None
    secret: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class WebhookDelivery(Result):
    """One event sent (or being sent) to an endpoint, and every attempt: `attempt_log` holds
    `{attempt, at, status_code, error, duration_ms}`, oldest first."""

    id: int = 0
    endpoint_id: int = 0
    message_id: str = ""
    event_type: str = ""
    status: str = ""  # pending, delivered or failed
    attempts: int = 0
    attempt_log: list[dict[str, Any]] = field(default_factory=list)
    next_attempt_at: datetime | None = None
    created_at: datetime | None = None
    finished_at: datetime | None = None
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AuditEntry(Result):
    """One entry of the audit log (`client.audit.list()`): who changed a key or a quota, and when."""

    id: int = 0
    created_at: datetime | None = None
    actor: str | None = None
    actor_key_id: int | None = None
    action: str = ""
    target: str = ""
    data: dict[str, Any] = field(default_factory=dict)
