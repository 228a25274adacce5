"""Whose files a data path names: the one rule for every path a request carries into GLUEJOBS_DATA_DIR.

Without API keys there is one user, and the whole folder is theirs. With keys, each owner's files
live in a folder of their own, GLUEJOBS_DATA_DIR/owners/<owner folder>/: a key's paths resolve there
and may not leave it (symbolic links are followed before the check), while an admin key may name
any path under GLUEJOBS_DATA_DIR. Every route that takes a path resolves it through
`DataScope.resolve` (via shared.admission.job_checks.check_job_spec), and `owner_folder` alone says which
folder is whose.

Uploaded files (`"train_file": "file-7"`) are named by id instead: `DataScope.uploaded` looks the id
up among the caller's files (an admin's: anyone's) through the resolver the API gives the scope,
so another owner's file is not found, on every route that takes a spec.

A spec stores its paths relative to GLUEJOBS_DATA_DIR (`owners/<folder>/train.csv`), which is all a
worker knows; a path given in that stored form resolves to the same file again, so a stored spec
(a rerun, a resubmitted job) passes the same check. A worker re-checks a stored path with
`stored_data_path`: a path in an owner's folder must resolve inside that folder, so a link put
there after submission cannot lead to another owner's files.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from shared.core.errors import InvalidSpec, quote
from shared.jobspec.job_sources import JobSource, is_job_source, parse_job_source
from shared.jobspec.registered_models import RegisteredModel, parse_reference
from shared.jobspec.settings_view import DataFolderSetting
from shared.jobspec.uploaded_files import UploadedFile

if TYPE_CHECKING:  # upload_tally reads with pandas, which the client's command line (it imports this) lacks
    from shared.jobspec.upload_tally import StoredUpload

OWNERS_DIR = "owners"


def owner_folder(owner: str) -> str:
    """The name of an owner's folder under GLUEJOBS_DATA_DIR/owners/.

    An owner's name (shared/core/config.OWNER_NAME: letters, digits, `.`, `_`, `-`, not starting with a
    dot) is safe as a folder name and used as it is: `owners/alice/`, or `owners/key-0123456789ab/`
    for a configured key that names no owner.
    """
    return owner


# Finds an uploaded file by id among the caller's (NotFound otherwise) and makes sure this machine
# has a checked copy of it: (its record, whether it is the caller's own).
UploadResolver = Callable[[str, str], tuple[UploadedFile, bool]]
# Finds a registered model by (owner or None for the caller's own, name) among those the caller may
# use (NotFound otherwise): its record.
ModelResolver = Callable[[str | None, str], RegisteredModel]


# Finds another job's model (`job:ID…`) among the jobs the caller may use (NotFound otherwise), has
# the store keep it by hash (shared/jobs_repo/model_objects.store_job_model): its record.
class JobModelResolver(Protocol):
    """A job's model as a record (service/deps.py): `pin` keeps its bytes for good, which only a job
    that is stored needs (a dry run's or a refused spec's resolution copies without pinning: what it
    copied is swept like any unheld object)."""

    def __call__(self, source: JobSource, *, pin: bool = True) -> RegisteredModel: ...


@dataclass(frozen=True)
class DataScope:
    """Where one caller's data paths resolve, and which files are the caller's own."""

    data_dir: Path  # GLUEJOBS_DATA_DIR, resolved
    folder: str  # the caller's folder relative to it ("" for all of it)
    owned_folder: str | None  # the caller's own files (their contents may be quoted back); None: all
    resolve_upload: UploadResolver | None = None  # None: no uploaded files here (the worker's re-check)
    resolve_model: ModelResolver | None = None  # None: no registered models here
    resolve_job_model: JobModelResolver | None = None  # None: no jobs' models here
    # The sha256 of the uploaded files resolved for the caller that are the caller's own.
    own_uploads: set[str] = field(default_factory=set, compare=False)
    # What each resolved upload's check found ({sha256: …}), which the data checks use instead of
    # reading the file again; and how to get this machine's copy when rows must be read (a dry run's
    # token lengths: its first rows).
    stored_uploads: dict[str, StoredUpload] = field(default_factory=dict, compare=False)
    fetch_upload: Callable[[UploadedFile], Path] | None = field(default=None, compare=False)

    def without_pins(self) -> DataScope:
        """This scope for a check that stores no job (a dry run, a refusal's salvage): a job's model it
        names is copied by hash but not pinned."""
        resolver = self.resolve_job_model
        if resolver is None:
            return self

        def unpinned(source: JobSource, *, pin: bool = True) -> RegisteredModel:
            return resolver(source, pin=False)

        return replace(self, resolve_job_model=unpinned)

    @property
    def root(self) -> Path:
        """The caller's folder, resolved."""
        return Path(os.path.realpath(self.data_dir / self.folder))

    @property
    def name(self) -> str:
        """The caller's folder as error messages name it (never the server's absolute path)."""
        return f"GLUEJOBS_DATA_DIR/{self.folder}" if self.folder else "GLUEJOBS_DATA_DIR"

    def resolve(self, value: str, *, field: str) -> Path:
        """The file `value` names (relative to the caller's folder, in the stored form relative to
        GLUEJOBS_DATA_DIR, or absolute), resolved; InvalidSpec when it leaves the caller's folder."""
        if "\x00" in value:
            raise InvalidSpec("path contains a NUL byte", field=field)
        candidate = Path(value)
        if candidate.is_absolute():
            full = candidate
        else:
            prefix = Path(self.folder).parts
            stored_form = bool(prefix) and candidate.parts[: len(prefix)] == prefix
            full = (self.data_dir if stored_form else self.data_dir / self.folder) / candidate
        resolved = Path(os.path.realpath(full))
        # Both: an owner's folder that is a link out of GLUEJOBS_DATA_DIR is not a place to read.
        if not (resolved.is_relative_to(self.root) and resolved.is_relative_to(self.data_dir)):
            # The whole path (a spec's paths are bounded), so the user recognises their own file.
            if candidate.is_absolute():
                raise InvalidSpec(
                    f"{value!r} is absolute and outside the data folder {self.name}: the API reads data "
                    f"files from that folder only; put the file there and give its path relative to it",
                    field=field,
                )
            raise InvalidSpec(f"{value!r} leaves the data folder {self.name}", field=field)
        return resolved

    def stored(self, path: Path) -> str:
        """How a spec stores a resolved path: relative to GLUEJOBS_DATA_DIR, so a worker finds it."""
        return path.relative_to(self.data_dir).as_posix()

    def uploaded(self, file_id: str, *, field: str, pinned: UploadedFile | None = None) -> UploadedFile:
        """The record of the caller's uploaded file `file_id` (NotFound for anyone else's); InvalidSpec
        when `pinned` (a record the spec carried) names other bytes."""
        if self.resolve_upload is None:
            raise InvalidSpec(f"{quote(file_id)}: uploaded files are not served here", field=field)
        record, own = self.resolve_upload(file_id, field)
        if pinned is not None and pinned.sha256 != record.sha256:
            raise InvalidSpec(
                f"{file_id} holds bytes with sha256 {record.sha256}, not the {pinned.sha256} the spec pins",
                field=f"uploaded_files.{field}.sha256",
            )
        if own:
            self.own_uploads.add(record.sha256)
        return record

    def registered(self, value: str, *, field: str, pinned: RegisteredModel | None = None) -> RegisteredModel:
        """The record of the registered model `value` (`model:NAME`, `model:OWNER/NAME`) the caller
        may use (NotFound otherwise); InvalidSpec when `pinned` (a record the spec carried) names
        other files. A job's model (`job:ID…`) the same way, through `resolve_job_model`."""
        if is_job_source(value):
            return self._job_model(value, field=field, pinned=pinned)
        try:
            owner, name = parse_reference(value)
        except ValueError as exc:
            raise InvalidSpec(str(exc), field=field) from None
        if self.resolve_model is None:
            raise InvalidSpec(f"{quote(value)}: registered models are not served here", field=field)
        record = self.resolve_model(owner, name)
        if pinned is not None and pinned.sha256 != record.sha256:
            raise InvalidSpec(
                f"{value} holds files with sha256 {record.sha256}, not the {pinned.sha256} the spec pins",
                field="registered_model.sha256",
            )
        return record

    def _job_model(self, value: str, *, field: str, pinned: RegisteredModel | None) -> RegisteredModel:
        try:
            source = parse_job_source(value)
        except ValueError as exc:
            raise InvalidSpec(str(exc), field=field) from None
        if self.resolve_job_model is None:
            raise InvalidSpec(f"{quote(value)}: jobs' models are not served here", field=field)
        record = self.resolve_job_model(source)
        if pinned is not None and pinned.sha256 != record.sha256:
            raise InvalidSpec(
                f"{value} holds files with sha256 {record.sha256}, not the {pinned.sha256} the spec pins",
                field="registered_model.sha256",
            )
        return record

    def owns(self, path: Path) -> bool:
        if self.owned_folder is None:
            return True
        if path.stem in self.own_uploads:  # a local copy of an uploaded file, named by its sha256
            return True
        return path.is_relative_to(Path(os.path.realpath(self.data_dir / self.owned_folder)))


def data_scope(
    settings: DataFolderSetting,
    *,
    owner: str | None,
    is_admin: bool,
    uploads: UploadResolver | None = None,
    stored: dict[str, StoredUpload] | None = None,
    fetch: Callable[[UploadedFile], Path] | None = None,
    models: ModelResolver | None = None,
    job_models: JobModelResolver | None = None,
) -> DataScope:
    """The scope of a caller: `owner` None means no keys are set (one user, who owns everything).
    `uploads` resolves the caller's uploaded files by id, filling `stored` with what their checks
    found; `fetch` makes this machine's copy of one; `models` resolves their registered models by name,
    `job_models` their jobs' models (`job:ID…`)."""
    data_dir = Path(os.path.realpath(settings.data_dir))
    folder, owned = ("", None) if owner is None else ("", f"{OWNERS_DIR}/{owner_folder(owner)}")
    if owned is not None and not is_admin:
        folder = owned
    return DataScope(
        data_dir=data_dir,
        folder=folder,
        owned_folder=owned,
        resolve_upload=uploads,
        resolve_model=models,
        resolve_job_model=job_models,
        stored_uploads=stored if stored is not None else {},
        fetch_upload=fetch,
    )


def stored_data_path(settings: DataFolderSetting, value: str, *, field: str) -> Path:
    """A stored spec's path as a worker resolves it: under GLUEJOBS_DATA_DIR and, when it lies in an
    owner's folder, inside that folder."""
    data_dir = Path(os.path.realpath(settings.data_dir))
    parts = Path(value).parts
    if not Path(value).is_absolute() and len(parts) > 2 and parts[0] == OWNERS_DIR and parts[1] != "..":
        folder = f"{OWNERS_DIR}/{parts[1]}"
        return DataScope(data_dir=data_dir, folder=folder, owned_folder=folder).resolve(value, field=field)
    return DataScope(data_dir=data_dir, folder="", owned_folder=None).resolve(value, field=field)
