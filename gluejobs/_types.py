"""What the client hands back: ApiError for every failure, and typed results built from the API's
JSON answers (the documented fields typed, the whole answer kept in `raw`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, TypeVar

TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})


class ApiError(Exception):
    """An error answer of the API (`{"error": {"code", "message", "field"?}}`) with its status code,
    or status_code 0 where no usable answer came: `unreachable` (no answer at all), or an answer the
    client refuses to act on — `unsafe_path` (a download path that leaves its folder),
    `answer_too_large`, `invalid_answer`."""

    def __init__(self, status_code: int, code: str, message: str, field: str | None = None) -> None:
        self.status_code = status_code
        self.code = code
        self.message = message
        self.field = field
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
    output_dir: str | None = None
    latest_metrics: dict[str, Any] = field(default_factory=dict)
    best_metrics: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    headline_metric: dict[str, Any] | None = None

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL_STATUSES


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
    path: str = ""
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
class StreamEvent:
    """One Server-Sent Event of /v1/jobs/{id}/stream: `event` is metric, checkpoint, status, event,
    log or end; `data` its decoded JSON; `id` the cursor to resume after it."""

    event: str
    data: Any
    id: str | None


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
    created_at: datetime | None = None
