"""Request and response bodies of /v1/files."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.files.upload_checks import upload_warnings
from shared.core.tables import File
from shared.jobs_repo import public_id


class WarningPublic(BaseModel):
    """What passed with a word of warning: where, a code, a sentence (an error's problems' shape)."""

    field: str
    code: str = Field(description="label_near_duplicate, rare_class, label_imbalance, long_rows")
    message: str


class FilePublic(BaseModel):
    """An uploaded file: what it holds, as the checks found it on its way in."""

    model_config = ConfigDict(from_attributes=True)

    id: str = Field(description="Name it in a job spec: train_file, validation_file or test_file")
    filename: str
    format: str = Field(description="csv, tsv, json, jsonl or parquet (from its name)")
    purpose: str = Field(description="train, validation or test (a test file may have no labels)")
    task_name: str | None = Field(description="The task its labels were checked against, if any")
    bytes: int
    sha256: str
    rows: int
    columns: list[str]
    checks: dict[str, Any] = Field(
        description="text_columns; labels (classes, scores or none) with label_counts or score_range; "
        "long_rows: rows with more words than max_length (128, the default) has tokens"
    )
    warnings: list[WarningPublic] = Field(
        default_factory=list,
        description="What will train but probably not as meant: near-duplicate labels (postive beside "
        "positive), rare classes, label imbalance, rows that will be truncated at max_length 128",
    )
    created_at: datetime

    @classmethod
    def of(cls, file: File) -> FilePublic:
        fields = {k: getattr(file, k) for k in cls.model_fields if k != "warnings"}
        warnings = [w.as_dict() for w in upload_warnings(dict(file.checks), file.rows)]
        return cls.model_validate({**fields, "id": public_id(file.id), "warnings": warnings})


class FileCheck(BaseModel):
    """POST /v1/files?dry_run=true: what the checks found; nothing was kept."""

    dry_run: bool = True
    filename: str
    format: str
    bytes: int
    sha256: str
    rows: int
    columns: list[str]
    checks: dict[str, Any]
    warnings: list[WarningPublic] = Field(default_factory=list, description="As an upload's warnings")


class FileDeleted(BaseModel):
    id: str
    deleted: bool = True


class DataFile(BaseModel):
    """A data file of a job, as the dashboard shows it."""

    field: str = Field(description="train_file, validation_file or test_file")
    file_id: str | None = Field(description="The uploaded file's id; null for a path under GLUEJOBS_DATA_DIR")
    filename: str = Field(description="The uploaded file's name, or the path")
    bytes: int | None = Field(description="Its size (uploaded files)")
    sha256: str | None = Field(description="The sha256 of its bytes (uploaded files)")


def data_files(spec: dict[str, Any]) -> list[DataFile]:
    """The files a job's stored spec names: uploaded ones with their recorded size and sha256."""
    uploaded = spec.get("uploaded_files") or {}
    found = []
    for name in ("train_file", "validation_file", "test_file"):
        value = spec.get(name)
        if value is None:
            continue
        record = uploaded.get(name)
        if record is not None:
            found.append(
                DataFile(
                    field=name,
                    file_id=value,
                    filename=record["filename"],
                    bytes=record["bytes"],
                    sha256=record["sha256"],
                )
            )
        else:
            found.append(DataFile(field=name, file_id=None, filename=str(value), bytes=None, sha256=None))
    return found
