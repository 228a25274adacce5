"""What a job reports as it runs: its metrics, checkpoints and events (GET /v1/jobs/{id}/metrics,
…/checkpoints, …/events, and the live stream's messages)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


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
