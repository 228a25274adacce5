"""A job's folder as the API serves it: listing, confinement, tar streams, logs. No HTTP here.

A job's folder is `jobs/<id>/` of the store (shared/core/storage.py: model files, checkpoints/,
logs/attempt-<n>.log, predictions), read through one of two `JobFolder`s:
- LocalFolder: the local store, the folder the workers write (GLUEJOBS_ARTIFACTS_DIR/jobs/<id>/,
  local or on a shared disk). Every path is resolved (symbolic links followed) and refused when it
  leaves the job's folder.
- StoredFolder: an object store, where workers upload what they write; it has no links to follow,
  and a checkpoint whose upload has not finished (no gluejobs_state.json yet) is not listed.
Listing, tar streams and logs are written once, over either.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path, PurePosixPath
from typing import IO, Protocol

from shared.core.errors import InvalidRequest, NotFound, quote
from shared.core.storage import Store, StoredFile
from shared.jobspec.model_names import NAME_MAX_BYTES

# The folder's layout is the worker's and the client's too (shared/wire/job_folder.py): a checkpoint
# is complete once its STATE_FILE is in, and a folder ending in PARTIAL_SUFFIX is still being written.
from shared.wire.job_folder import (
    CHECKPOINTS,
    LOG_DIR,
    MERGED_DIR,
    PARTIAL_SUFFIX,
    STATE_FILE,
    attempt_of_log,
)

CHUNK_BYTES = 1 << 20
MAX_LISTED_FILES = 20_000
# The live stream sends a log in pieces of at most this size, cut at line ends: a newline, or the
# carriage return a progress bar rewrites its line with (so that its newest state arrives as it is drawn).
MAX_LOG_PIECE_BYTES = 64 * 1024
# Linux's PATH_MAX: a longer path names no file (and stat() would fail with ENAMETOOLONG).
PATH_MAX_BYTES = 4096


@dataclass(frozen=True)
class Artifact:
    path: str  # relative to the job's folder, with forward slashes
    size: int
    modified: datetime
    kind: str  # model, checkpoint, predictions, log or other


@dataclass(frozen=True)
class Member:
    """A file of a folder being sent as a tar stream: its name in the archive and how to read it."""

    name: str
    size: int
    mtime: float
    open: Callable[[], IO[bytes]]


class JobFolder(Protocol):
    """A job's folder, wherever the store keeps it."""

    def artifacts(self) -> list[Artifact]:
        """Every file of the folder (sorted by path, at most MAX_LISTED_FILES)."""
        ...

    def kind(self, relative: str) -> str | None:
        """ "file", "dir", or None when `relative` names nothing (InvalidRequest when it leaves)."""
        ...

    def members(self, relative: str) -> Iterator[Member]:
        """The files under the folder `relative`, named `<its name>/<path inside it>`."""
        ...

    def open(self, relative: str) -> IO[bytes]: ...

    def read(self, relative: str, start: int = 0, end: int | None = None) -> bytes:
        """A file's bytes from `start` to `end` in one read: from an object store, one request,
        retried as every store operation is (never a file object's piecewise reads outside it)."""
        ...

    def size(self, relative: str) -> int: ...

    def logs(self) -> dict[int, str]:
        """The attempts' logs: {attempt: relative path}, by attempt."""
        ...


def confined(root: Path, relative: str) -> Path:
    """`relative` under `root`, symbolic links resolved; refused when it leaves `root` or is not a
    name the filesystem can hold (a component over 255 bytes, a path over 4096)."""
    _check_name(relative)
    target = (root / relative).resolve()
    if not target.is_relative_to(root):
        raise InvalidRequest(f"path {quote(relative)} leaves the job's folder", field="path")
    return target


def _check_name(relative: str) -> None:
    if "\0" in relative or Path(relative).is_absolute():
        raise InvalidRequest(f"path {quote(relative)} is not a path inside the job's folder", field="path")
    encoded = relative.encode("utf-8", "surrogateescape")
    if len(encoded) > PATH_MAX_BYTES or any(len(part) > NAME_MAX_BYTES for part in encoded.split(b"/")):
        raise InvalidRequest(
            f"path {quote(relative)} is longer than a file name can be ({NAME_MAX_BYTES} bytes a component, "
            f"{PATH_MAX_BYTES} in all)",
            field="path",
        )


def kind_of(relative: PurePosixPath) -> str:
    top = relative.parts[0]
    if top == LOG_DIR:
        return "log"
    if top == CHECKPOINTS:
        return "checkpoint"
    if len(relative.parts) == 1 and relative.suffix == ".tsv":
        return "predictions"  # predict_results.tsv and the GLUE submission file <Task>.tsv
    if len(relative.parts) == 1 or top == MERGED_DIR:
        return "model"  # the final model (or LoRA adapter) and tokenizer; merged/ for LoRA
    return "other"


def _artifact(path: str, size: int, modified: datetime) -> Artifact:
    return Artifact(path=path, size=size, modified=modified, kind=kind_of(PurePosixPath(path)))


# ---------------------------------------------------------------------------------------------------
# The local store: the folder itself
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalFolder:
    root: Path  # resolved

    def artifacts(self) -> list[Artifact]:
        """Every file under the job's folder that stays inside it, sorted by path."""
        if not self.root.is_dir():
            return []
        found: list[Artifact] = []
        for folder, dirs, files in os.walk(self.root, followlinks=False):
            # Checkpoints still being written are not artifacts; linked folders are not walked (a link
            # could loop or lead out), but a linked file that stays inside is listed.
            dirs[:] = sorted(
                d for d in dirs if not d.endswith(PARTIAL_SUFFIX) and not Path(folder, d).is_symlink()
            )
            for name in sorted(files):
                path = Path(folder, name)
                resolved = path.resolve()
                if not resolved.is_relative_to(self.root) or not resolved.is_file():
                    continue
                stat = resolved.stat()
                modified = datetime.fromtimestamp(stat.st_mtime, UTC)
                found.append(_artifact(path.relative_to(self.root).as_posix(), stat.st_size, modified))
                if len(found) >= MAX_LISTED_FILES:
                    return found
        return found

    def kind(self, relative: str) -> str | None:
        target = confined(self.root, relative)
        try:
            return "dir" if target.is_dir() else "file" if target.is_file() else None
        except OSError:  # unreadable (permissions …): as good as absent, to the caller
            return None

    def path(self, relative: str) -> Path:
        return confined(self.root, relative)

    def members(self, relative: str) -> Iterator[Member]:
        folder = confined(self.root, relative)
        for current, dirs, files in os.walk(folder, followlinks=False):
            dirs[:] = sorted(d for d in dirs if not Path(current, d).is_symlink())
            for name in sorted(files):
                path = Path(current, name)
                if path.resolve().is_relative_to(self.root) and path.resolve().is_file():
                    stat = path.stat()
                    yield Member(
                        f"{folder.name}/{path.relative_to(folder).as_posix()}",
                        stat.st_size,
                        stat.st_mtime,
                        lambda path=path: path.open("rb"),  # type: ignore[misc]
                    )

    def open(self, relative: str) -> IO[bytes]:
        return confined(self.root, relative).open("rb")

    def read(self, relative: str, start: int = 0, end: int | None = None) -> bytes:
        with self.open(relative) as handle:
            handle.seek(start)
            return handle.read() if end is None else handle.read(max(0, end - start))

    def size(self, relative: str) -> int:
        return confined(self.root, relative).stat().st_size

    def logs(self) -> dict[int, str]:
        folder = self.root / LOG_DIR
        if not folder.is_dir():
            return {}
        found = {}
        for path in folder.iterdir():
            attempt = attempt_of_log(path.name)
            if attempt is not None and path.resolve().is_relative_to(self.root):
                found[attempt] = f"{LOG_DIR}/{path.name}"
        return dict(sorted(found.items()))


# ---------------------------------------------------------------------------------------------------
# An object store: what the workers uploaded
# ---------------------------------------------------------------------------------------------------


class StoredFolder:
    """A job's folder in an object store (one listing per request, read when first needed)."""

    def __init__(self, store: Store, prefix: str) -> None:
        self.store = store
        self.prefix = prefix
        self._files: list[StoredFile] | None = None

    def _listing(self) -> list[StoredFile]:
        if self._files is None:
            files = self.store.list(self.prefix)
            names = {f.path for f in files}
            # A checkpoint counts once its state file (uploaded last) is there.
            self._files = [f for f in files if _uploaded_whole(f.path, names)]
        return self._files

    def key(self, relative: str) -> str:
        _check_name(relative)
        parts = PurePosixPath(relative).parts
        if ".." in parts or "." in parts:
            raise InvalidRequest(f"path {quote(relative)} leaves the job's folder", field="path")
        return f"{self.prefix}/{PurePosixPath(relative).as_posix()}"

    def artifacts(self) -> list[Artifact]:
        return [_artifact(f.path, f.size, f.modified) for f in self._listing()[:MAX_LISTED_FILES]]

    def kind(self, relative: str) -> str | None:
        self.key(relative)
        name = PurePosixPath(relative).as_posix().strip("/")
        for f in self._listing():
            if f.path == name:
                return "file"
            if f.path.startswith(f"{name}/"):
                return "dir"
        return None

    def members(self, relative: str) -> Iterator[Member]:
        name = PurePosixPath(relative).as_posix().strip("/")
        base = PurePosixPath(name).name
        for f in self._listing():
            if f.path.startswith(f"{name}/"):
                key = self.key(f.path)
                yield Member(
                    f"{base}/{f.path[len(name) + 1 :]}",
                    f.size,
                    f.modified.timestamp(),
                    lambda key=key: self.store.open(key),  # type: ignore[misc]
                )

    def open(self, relative: str) -> IO[bytes]:
        return self.store.open(self.key(relative))

    def read(self, relative: str, start: int = 0, end: int | None = None) -> bytes:
        return self.store.read(self.key(relative), start, end)

    def size(self, relative: str) -> int:
        return self.store.size(self.key(relative))

    def logs(self) -> dict[int, str]:
        # Listed afresh each time: a live stream asks again and again while the job runs.
        found = {}
        for f in self.store.list(f"{self.prefix}/{LOG_DIR}"):
            parts = (LOG_DIR, *PurePosixPath(f.path).parts)
            attempt = attempt_of_log(parts[-1]) if len(parts) == 2 else None
            if attempt is not None:
                found[attempt] = f"{LOG_DIR}/{f.path}"
        return dict(sorted(found.items()))


def _uploaded_whole(path: str, names: set[str]) -> bool:
    parts = PurePosixPath(path).parts
    if len(parts) < 3 or parts[0] != CHECKPOINTS:
        return True
    return f"{parts[0]}/{parts[1]}/{STATE_FILE}" in names


def job_folder(store: Store, root: Path, prefix: str) -> JobFolder:
    """The job's folder: `root` itself with the local store, else its copy under `prefix`."""
    return LocalFolder(root) if store.is_local else StoredFolder(store, prefix)


# ---------------------------------------------------------------------------------------------------
# Tar streams
# ---------------------------------------------------------------------------------------------------


def tar_stream(members: Iterable[Member]) -> Iterator[bytes]:
    """Files as an uncompressed tar, produced piece by piece so a multi-gigabyte checkpoint never
    sits in memory. tarfile writes whole members to a file object, which cannot be streamed, so its
    headers (TarInfo.tobuf) are used and each file's bytes follow in chunks, padded to 512-byte blocks.
    """
    for member in members:
        info = tarfile.TarInfo(member.name)
        info.size, info.mtime, info.mode = member.size, int(member.mtime), 0o644
        yield info.tobuf(format=tarfile.PAX_FORMAT)
        remaining = info.size
        try:
            with member.open() as handle:
                while remaining > 0 and (chunk := handle.read(min(CHUNK_BYTES, remaining))):
                    remaining -= len(chunk)
                    yield chunk
        except OSError:
            pass  # removed while streaming (checkpoint rotation): the header promised bytes, so pad
        if remaining:
            yield b"\0" * remaining
        yield b"\0" * (-info.size % tarfile.BLOCKSIZE)
    yield b"\0" * (2 * tarfile.BLOCKSIZE)  # end of archive


# ---------------------------------------------------------------------------------------------------
# Logs: <job folder>/logs/attempt-<n>.log, one per attempt (worker/fleet/supervisor.py writes them)
# ---------------------------------------------------------------------------------------------------


def read_log(
    folder: JobFolder, *, job_id: int, attempt: int | None, tail: int | None
) -> tuple[int | None, bytes, int]:
    """(the attempt, its log, where in the file the served text ends): the newest attempt's unless one
    is named; (None, b"", 0) before any. The end is the byte offset a stream's cursor resumes from."""
    logs = folder.logs()
    if attempt is None:
        if not logs:
            return None, b"", 0
        attempt = max(logs)
    if attempt not in logs:
        raise NotFound(f"job {job_id} has no log of attempt {attempt}", field="attempt")
    # Whole reads and ranges, never a file object read in pieces: a worker re-uploads a running
    # job's log, and an object replaced under such a reader failed its read with a 500 (issue 34
    # item 3). A log only grows, so ranges read from two of its uploads still fit together.
    path = logs[attempt]
    if tail is not None:
        return (attempt, *tail_bytes(partial(folder.read, path), folder.size(path), tail))
    data = folder.read(path)
    return attempt, data, len(data)


def tail_bytes(read: Callable[[int, int], bytes], end: int, lines: int) -> tuple[bytes, int]:
    """The last `lines` lines of a file `end` bytes long (`read(start, end)` reads a range), read
    backwards in blocks (a long log is not read whole), and the offset of the file's end they were
    read up to. Lines end as bytes.splitlines ends them (a newline, or a progress bar's carriage
    return), and the reading stops once it has that many."""
    data, position = b"", end
    while position > 0 and _line_ends(data) <= lines:
        step = min(CHUNK_BYTES // 16, position)
        position -= step
        data = read(position, position + step) + data
    kept = data.splitlines(keepends=True)[-lines:] if lines else []
    return b"".join(kept), end


def _line_ends(data: bytes) -> int:
    return data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")


@dataclass(frozen=True)
class LogPiece:
    attempt: int
    offset: int  # where the next piece starts in this attempt's log
    text: str


def new_log_pieces(folder: JobFolder, *, attempt: int, offset: int, flush: bool) -> list[LogPiece]:
    """Log text written since (attempt, offset), in whole lines (ending in a newline or a carriage
    return; all of it when `flush`, as when the job has ended), across attempts; at most
    MAX_LOG_PIECE_BYTES per piece."""
    pieces = []
    for number, path in folder.logs().items():
        if number < attempt:
            continue
        start = offset if number == attempt else 0
        while True:
            data = folder.read(path, start, start + MAX_LOG_PIECE_BYTES)
            if not data:
                break
            if len(data) == MAX_LOG_PIECE_BYTES or not flush:
                cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
                data = data[:cut] if cut else (data if len(data) == MAX_LOG_PIECE_BYTES else b"")
            if not data:
                break
            start += len(data)
            pieces.append(LogPiece(number, start, data.decode(errors="replace")))
            if len(pieces) >= 16:  # the rest goes in the next poll
                return pieces
    return pieces
