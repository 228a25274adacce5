"""A worker's disk: its free-space floor, and whether an error was the disk filling up.

A full disk is the worker's problem, not the job's (issue 34): another worker may have room. So a
worker below GLUEJOBS_WORKER_MIN_FREE_BYTES on the disk of its artifacts or cache folder claims
nothing (state low_disk, /readyz 503) until it has room again, and an attempt that died of a full
disk is handed back without spending an attempt (jobs_repo.hand_back_job, a bounded count).

Torch-free and cheap (one statvfs per folder): the worker asks before every claim and every
heartbeat. A job's process can ask too, before it writes a checkpoint (`check_room`).
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path

from shared.core.config import Settings

# errnos of a write refused for want of room: the disk is full, or the user's quota is.
_NO_ROOM_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# How a full disk reads in messages that lost their errno on the way: Rust's io::Error (safetensors:
# "No space left on device (os error 28)"), C's strerror, a quota's.
_NO_ROOM_WORDS = ("no space left on device", "os error 28", "disk quota exceeded", "os error 122")
MIB = 1024 * 1024


@dataclass(frozen=True)
class DiskState:
    """The fullest of the worker's job disks: its free bytes, and the floor it is held to."""

    free_bytes: int
    floor_bytes: int

    @property
    def low(self) -> bool:
        return self.floor_bytes > 0 and self.free_bytes < self.floor_bytes

    def describe(self) -> str:
        """In words, without a path (users may read it)."""
        return f"{_mib(self.free_bytes)} free on the worker's disk; its floor is {_mib(self.floor_bytes)}"

    def as_dict(self) -> dict[str, object]:
        return {"free_bytes": self.free_bytes, "min_free_bytes": self.floor_bytes, "low": self.low}


def job_disks(settings: Settings) -> list[Path]:
    """The folders a job writes to on this machine: its own folder (under artifacts_dir: checkpoints,
    logs, outputs) and the cache (tokenised data, fetched files)."""
    return [settings.artifacts_dir, settings.cache_dir]


def disk_state(settings: Settings, folders: list[Path] | None = None) -> DiskState:
    """The least free space among `folders` (default: the job disks). A folder not made yet is
    measured at its nearest existing parent: the disk it will be on."""
    free = min(_free_bytes(folder) for folder in (folders or job_disks(settings)))
    return DiskState(free_bytes=free, floor_bytes=settings.worker_min_free_bytes)


def check_room(settings: Settings, folder: Path, *, needed_bytes: int = 0) -> None:
    """Raise OSError(ENOSPC) when `folder`'s disk is below the floor (plus `needed_bytes`): for a
    writer about to write a lot (a checkpoint), so that the attempt ends as no_space before a
    half-written file rather than with whatever its library says about a short write."""
    state = disk_state(settings, [folder])
    if state.floor_bytes and state.free_bytes < state.floor_bytes + needed_bytes:
        raise OSError(errno.ENOSPC, f"No space left on device: {state.describe()}")


def is_no_space(exc: BaseException) -> bool:
    """Whether `exc`, or an exception it was raised from, is a write refused for want of room."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _NO_ROOM_ERRNOS:
            return True
        if any(words in str(current).lower() for words in _NO_ROOM_WORDS):
            return True
        current = current.__cause__ or current.__context__
    return False


def _free_bytes(folder: Path) -> int:
    path = Path(folder).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize  # what an unprivileged writer may still use


def _mib(count: int) -> str:
    return f"{count / MIB:.1f} MiB" if count < 10 * 1024 * MIB else f"{count / 1024**3:.1f} GiB"
