"""GET /v1/leaderboard's answer: per task, the best jobs and sweeps beside the majority-class baseline."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


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
