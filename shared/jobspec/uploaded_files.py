"""Uploaded files as a job spec names them, and this machine's copies of them.

A spec names an uploaded file by its id wherever it takes a file name (`"train_file": "file-7"`);
the API resolves the id in the caller's scope and stores the file's record beside it, under
`uploaded_files` (`{"train_file": {"id", "filename", "bytes", "sha256"}}`), so the stored spec says
exactly which bytes the job trained on.

The API and the workers read an uploaded file from a local copy (`cache_path`), which
shared/data/local_copies.py fetches and checks. This module is light (pydantic only): the client's
command line reads the spec's fields through it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

FILE_ID = re.compile(r"^file-[0-9]{1,18}$")
SHA256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


def is_file_id(value: str) -> bool:
    """Whether a spec's file value names an uploaded file (`file-7`) rather than a path."""
    return bool(FILE_ID.match(value))


class UploadedFile(BaseModel):
    """An uploaded file a spec field names: filled in by the API from the file itself."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=FILE_ID.pattern, description="The file's id, as POST /v1/files answered it")
    filename: str = Field(min_length=1, max_length=255, description="Its name when it was uploaded")
    bytes: int = Field(ge=0, description="Its size")
    sha256: SHA256 = Field(description="The sha256 of its bytes: the job reads exactly these")

    @property
    def suffix(self) -> str:
        return Path(self.filename).suffix.lower()


def cache_path(cache_dir: Path, sha256: str, suffix: str) -> Path:
    """Where this machine keeps its copy of an uploaded file."""
    return cache_dir / "files" / sha256[:2] / f"{sha256}{suffix}"
