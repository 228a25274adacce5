"""The local side of an upload, as both clients make it (gluejobs/resources/files.py sends it): the
file read and hashed first, so that the API is asked whether it holds those bytes already, and they
are sent only when it does not.

A file is identified by its sha256 and its format (the suffix of its name, which decides how it is
read): the caller's file with the same bytes and format is reused as it is.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from gluejobs._core import DEFAULT_TIMEOUT_S
from gluejobs._types import ApiError, FileInfo

# The spec's column mapping, which an upload takes as form fields: the API's words (shared/wire),
# re-exported for the command line.
from shared.wire.vocabulary import COLUMN_FIELDS as COLUMN_FIELDS

SUFFIXES = (".csv", ".tsv", ".json", ".jsonl", ".parquet")
# An upload of a few gigabytes takes a while: no read timeout on the answer, which comes once the
# API has checked and stored the whole file.
UPLOAD_TIMEOUT = httpx.Timeout(DEFAULT_TIMEOUT_S, write=None, read=None)
# Where each spec field's file is checked for: a test file may have no labels.
PURPOSE_OF_FIELD = {"train_file": "train", "validation_file": "validation", "test_file": "test"}


@dataclass(frozen=True)
class LocalFile:
    path: Path
    sha256: str
    format: str

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> LocalFile:
        """The file at `path`, hashed; ApiError `invalid_file` when it is not a data file here."""
        local = Path(path).expanduser()
        if not local.is_file():
            raise ApiError(0, "invalid_file", f"{str(path)!r} is not a file on this machine", field="file")
        if local.suffix.lower() not in SUFFIXES:
            raise ApiError(
                0,
                "invalid_file",
                f"{local.name!r}: name it .csv, .tsv, .json, .jsonl or .parquet",
                field="file",
            )
        with local.open("rb") as handle:
            digest = hashlib.file_digest(handle, "sha256").hexdigest()
        return cls(local, digest, local.suffix.lower().removeprefix("."))

    def reusable(self, rows: Iterable[FileInfo], columns: Mapping[str, str] | None = None) -> FileInfo | None:
        """The caller's file with these bytes, checked with this column mapping (a file checked with
        another is sent again: the API then tallies its labels by the new one)."""
        wanted = given_columns(columns)
        return next(
            (
                row
                for row in rows
                if row.sha256 == self.sha256
                and row.format == self.format
                and (row.checks.get("columns") or {}) == wanted
            ),
            None,
        )


def given_columns(columns: Mapping[str, str | None] | None) -> dict[str, str]:
    """The column mapping's fields that name a column (text_column, text_pair_column, label_column)."""
    return {name: value for name, value in (columns or {}).items() if name in COLUMN_FIELDS and value}


def is_local_file(value: object) -> bool:
    """Whether a spec's file value names a file on this machine (which `submit` uploads first)."""
    return isinstance(value, str) and not value.startswith("file-") and Path(value).expanduser().is_file()
