"""A job's folder as the API serves it: listing, confinement, tar streams, logs. No HTTP here.

The worker writes <GLUEJOBS_ARTIFACTS_DIR>/jobs/<id>/ (model files, checkpoints/, logs/attempt-<n>.log,
predictions); the API reads the same folder, so both must mount the same artifacts directory.
Every path is resolved (symbolic links followed) and refused when it leaves the job's folder.
"""

from __future__ import annotations

import os
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

from shared.errors import InvalidRequest, NotFound, quote
from shared.model_names import NAME_MAX_BYTES

LOGS = "logs"
CHECKPOINTS = "checkpoints"
PARTIAL_SUFFIX = ".partial"  # a checkpoint being written (worker/checkpoints.py): not an artifact yet
_LOG_NAME = re.compile(r"^attempt-(\d+)\.log$")
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


def confined(root: Path, relative: str) -> Path:
    """`relative` under `root`, symbolic links resolved; refused when it leaves `root` or is not a
    name the filesystem can hold (a component over 255 bytes, a path over 4096)."""
    if "\0" in relative or Path(relative).is_absolute():
        raise InvalidRequest(f"path {quote(relative)} is not a path inside the job's folder", field="path")
    encoded = relative.encode("utf-8", "surrogateescape")
    if len(encoded) > PATH_MAX_BYTES or any(len(part) > NAME_MAX_BYTES for part in encoded.split(b"/")):
        raise InvalidRequest(
            f"path {quote(relative)} is longer than a file name can be ({NAME_MAX_BYTES} bytes a component, "
            f"{PATH_MAX_BYTES} in all)",
            field="path",
        )
    target = (root / relative).resolve()
    if not target.is_relative_to(root):
        raise InvalidRequest(f"path {quote(relative)} leaves the job's folder", field="path")
    return target


def kind_of(relative: PurePosixPath) -> str:
    top = relative.parts[0]
    if top == LOGS:
        return "log"
    if top == CHECKPOINTS:
        return "checkpoint"
    if len(relative.parts) == 1 and relative.suffix == ".tsv":
        return "predictions"  # predict_results.tsv and the GLUE submission file <Task>.tsv
    if len(relative.parts) == 1 or top == "merged":
        return "model"  # the final model (or LoRA adapter) and tokenizer; merged/ for LoRA
    return "other"


def list_artifacts(root: Path) -> list[Artifact]:
    """Every file under the job's folder that stays inside it, sorted by path."""
    if not root.is_dir():
        return []
    found: list[Artifact] = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        # Checkpoints still being written are not artifacts; linked folders are not walked (a link
        # could loop or lead out), but a linked file that stays inside is listed.
        dirs[:] = sorted(
            d for d in dirs if not d.endswith(PARTIAL_SUFFIX) and not Path(folder, d).is_symlink()
        )
        for name in sorted(files):
            path = Path(folder, name)
            resolved = path.resolve()
            if not resolved.is_relative_to(root) or not resolved.is_file():
                continue
            stat = resolved.stat()
            relative = PurePosixPath(path.relative_to(root).as_posix())
            found.append(
                Artifact(
                    path=str(relative),
                    size=stat.st_size,
                    modified=datetime.fromtimestamp(stat.st_mtime, UTC),
                    kind=kind_of(relative),
                )
            )
            if len(found) >= MAX_LISTED_FILES:
                return found
    return found


def tar_stream(root: Path, folder: Path) -> Iterator[bytes]:
    """`folder` as an uncompressed tar, produced piece by piece so a multi-gigabyte checkpoint never
    sits in memory. tarfile writes whole members to a file object, which cannot be streamed, so its
    headers (TarInfo.tobuf) are used and each file's bytes follow in chunks, padded to 512-byte blocks.
    """
    base = folder.name
    for path in _files_under(root, folder):
        stat = path.stat()
        info = tarfile.TarInfo(f"{base}/{path.relative_to(folder).as_posix()}")
        info.size, info.mtime, info.mode = stat.st_size, int(stat.st_mtime), 0o644
        yield info.tobuf(format=tarfile.PAX_FORMAT)
        remaining = info.size
        try:
            with path.open("rb") as handle:
                while remaining > 0 and (chunk := handle.read(min(CHUNK_BYTES, remaining))):
                    remaining -= len(chunk)
                    yield chunk
        except OSError:
            pass  # removed while streaming (checkpoint rotation): the header promised bytes, so pad
        if remaining:
            yield b"\0" * remaining
        yield b"\0" * (-info.size % tarfile.BLOCKSIZE)
    yield b"\0" * (2 * tarfile.BLOCKSIZE)  # end of archive


def _files_under(root: Path, folder: Path) -> Iterator[Path]:
    for current, dirs, files in os.walk(folder, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not Path(current, d).is_symlink())
        for name in sorted(files):
            path = Path(current, name)
            if path.resolve().is_relative_to(root) and path.resolve().is_file():
                yield path


# ---------------------------------------------------------------------------------------------------
# Logs: <job folder>/logs/attempt-<n>.log, one per attempt (worker/runner.py writes them)
# ---------------------------------------------------------------------------------------------------


def log_files(root: Path) -> dict[int, Path]:
    folder = root / LOGS
    if not folder.is_dir():
        return {}
    found = {}
    for path in folder.iterdir():
        match = _LOG_NAME.match(path.name)
        if match and path.resolve().is_relative_to(root):
            found[int(match.group(1))] = path
    return dict(sorted(found.items()))


def read_log(
    root: Path, *, job_id: int, attempt: int | None, tail: int | None
) -> tuple[int | None, bytes, int]:
    """(the attempt, its log, where in the file the served text ends): the newest attempt's unless one
    is named; (None, b"", 0) before any. The end is the byte offset a stream's cursor resumes from."""
    logs = log_files(root)
    if attempt is None:
        if not logs:
            return None, b"", 0
        attempt = max(logs)
    if attempt not in logs:
        raise NotFound(f"job {job_id} has no log of attempt {attempt}", field="attempt")
    path = logs[attempt]
    if tail is not None:
        return (attempt, *tail_bytes(path, tail))
    data = path.read_bytes()
    return attempt, data, len(data)


def tail_bytes(path: Path, lines: int) -> tuple[bytes, int]:
    """The last `lines` lines, read backwards in blocks (a long log is not read whole), and the
    offset of the file's end they were read up to. Lines end as bytes.splitlines ends them (a
    newline, or a progress bar's carriage return), and the reading stops once it has that many."""
    with path.open("rb") as handle:
        end = handle.seek(0, os.SEEK_END)
        data, position = b"", end
        while position > 0 and _line_ends(data) <= lines:
            step = min(CHUNK_BYTES // 16, position)
            position -= step
            handle.seek(position)
            data = handle.read(step) + data
    kept = data.splitlines(keepends=True)[-lines:] if lines else []
    return b"".join(kept), end


def _line_ends(data: bytes) -> int:
    return data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")


@dataclass(frozen=True)
class LogPiece:
    attempt: int
    offset: int  # where the next piece starts in this attempt's log
    text: str


def new_log_pieces(root: Path, *, attempt: int, offset: int, flush: bool) -> list[LogPiece]:
    """Log text written since (attempt, offset), in whole lines (ending in a newline or a carriage
    return; all of it when `flush`, as when the job has ended), across attempts; at most
    MAX_LOG_PIECE_BYTES per piece."""
    pieces = []
    for number, path in log_files(root).items():
        if number < attempt:
            continue
        start = offset if number == attempt else 0
        while True:
            with path.open("rb") as handle:
                handle.seek(start)
                data = handle.read(MAX_LOG_PIECE_BYTES)
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
