"""GET /v1/workers' answer: each worker with its build (issue 35 item 1: two builds of one release
read alike as "0.2.0")."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from shared.core.tables import JobStatus


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


class WorkerBuildPublic(BaseModel):
    version: str = Field(description="The release, e.g. 0.2.0")
    build: str = Field(description="Hash of the build's code (shared/ and worker/): differs between commits")
    commit: str | None = Field(description="The git commit it was built from, where known")
    schema_head: str = Field(description="The newest database schema revision the build knows")
    spec_fields: list[str] = Field(
        description="The job spec fields it supports: it hands back, untouched, a job that uses another"
    )


class WorkerWithBuild(WorkerPublic):
    build: WorkerBuildPublic | None = Field(
        default=None, description="Its build; null for a worker of a build from before builds were recorded"
    )


class WorkersPublic(BaseModel):
    data: list[WorkerWithBuild]
