"""GET /v1/workers' answer: each worker with its build (issue 35 item 1: two builds of one release
read alike as "0.2.0")."""

from __future__ import annotations

from pydantic import BaseModel, Field

from service.schemas.jobs import WorkerPublic


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
