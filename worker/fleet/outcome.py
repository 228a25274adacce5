"""How a job's process tells its worker why it ended, and what kind of failure it was.

A failing process leaves `logs/error-rank<N>.json` in the job's folder: {"code", "message"}, the
code an ErrorCode (shared.core.tables). The worker reserves the file's room before the process starts
(`reserve_error_files`) and the process writes into it in place, so a disk that filled up still gets
the cause; without it, the worker's own view (its disk below the floor, the kernel's OOM kill count,
the exit signal) says what it can. Exit statuses say the rest: PREEMPTED_EXIT (stopped on request
with a checkpoint), and a death by signal or without an error file (killed, or the interpreter
crashed). Torch-free, so the runner (which never imports torch) can read it all. The failure read
here has no traceback frames; worker/training/user_text.py also takes the worker's paths out before the job's
row gets it.
"""

from __future__ import annotations

import itertools
import json
import signal
from dataclasses import dataclass
from pathlib import Path

from shared.core.db_retries import is_transient
from shared.core.errors import GluejobsError, InvalidSpec, JobFailed
from shared.core.tables import ErrorCode
from shared.wire.job_folder import LOG_DIR
from worker.training.disk_space import DiskState, is_no_space
from worker.training.user_text import drop_tracebacks

MAX_ERROR_CHARS = 4000
TAIL_LINES = 20
TAIL_HEADING = "last log lines:"  # between a failure's cause and the last lines of its log
# The job's process saved a checkpoint and stopped because it was asked to (its worker is shutting
# down): the job goes back to the queue without spending an attempt. (EX_TEMPFAIL.)
PREEMPTED_EXIT = 75

# The room reserved for each error file: a message clipped to MAX_ERROR_CHARS, JSON-escaped (ASCII:
# up to 6 bytes a character), fits.
ERROR_FILE_ROOM = 6 * MAX_ERROR_CHARS + 256
# Failures of the worker's resources, not of the job: handed back without spending an attempt, a
# bounded number of times (jobs_repo.hand_back_job), since another worker may have the room.
RESOURCE_CODES = frozenset({ErrorCode.no_space, ErrorCode.out_of_memory})
NO_SPACE_CAUSE = "no space left on the worker"

# Words in an exception's text that mark the accelerator or its collectives failing, not the job.
_DEVICE_MARKERS = ("CUDA error", "NCCL", "cuDNN error", "CUBLAS_STATUS", "device-side assert")


@dataclass(frozen=True)
class Failure:
    code: ErrorCode
    message: str


def log_dir(output_dir: Path) -> Path:
    return output_dir / LOG_DIR


def error_file(output_dir: Path, rank: int) -> Path:
    folder = log_dir(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"error-rank{rank}.json"


def reserve_error_files(output_dir: Path, ranks: int) -> None:
    """Room for each rank's error file, taken while the disk has it (the worker, before the start)."""
    for rank in range(ranks):
        error_file(output_dir, rank).write_bytes(b" " * ERROR_FILE_ROOM)


def write_failure(output_dir: Path, rank: int, failure: Failure) -> None:
    """Into the reserved room when there is one (in place: a full disk gives no new block), else a
    new file. Trailing spaces are JSON whitespace."""
    message = _clip(failure.message)
    data = json.dumps({"code": failure.code, "message": message}).encode()
    path = error_file(output_dir, rank)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        size = 0
    if size >= len(data):
        with path.open("r+b") as f:
            f.write(data.ljust(size))
    else:
        path.write_bytes(data)


def discard_error_file(output_dir: Path, rank: int) -> None:
    """A rank that succeeded gives its reserved room back (before its outputs go to the store)."""
    (log_dir(output_dir) / f"error-rank{rank}.json").unlink(missing_ok=True)


def clear_errors(output_dir: Path) -> None:
    for path in log_dir(output_dir).glob("error-rank*.*"):
        path.unlink(missing_ok=True)


def classify(exc: BaseException) -> ErrorCode:
    """The error code of an exception raised in a job's process."""
    if is_no_space(exc):  # first: a full disk breaks whatever was writing, in its own words
        return ErrorCode.no_space
    if isinstance(exc, GluejobsError):
        code = getattr(exc, "failure_code", None)
        if code is not None:
            return ErrorCode(code)
        if isinstance(exc, (InvalidSpec, JobFailed)):
            return ErrorCode.invalid_data
    if type(exc).__name__ == "ValidationError":  # pydantic: a stored spec this version refuses
        return ErrorCode.invalid_data
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return ErrorCode.out_of_memory
    text = str(exc)
    if isinstance(exc, RuntimeError):
        if "out of memory" in text:
            return ErrorCode.out_of_memory
        if any(marker in text for marker in _DEVICE_MARKERS):
            return ErrorCode.device_error
    if is_transient(exc):
        return ErrorCode.database_unreachable
    return ErrorCode.internal


def read_failure(
    output_dir: Path,
    returncode: int,
    log_path: Path,
    *,
    disk: DiskState | None = None,
    oom_killed: bool = False,
) -> Failure:
    """The process's own account of its failure, else what its exit status tells; with the last
    lines of its log either way. The worker's own view weighs in: `disk`, its job disk as the
    process ended (below the floor, an unexplained failure or an `internal` one is taken for the
    full disk: torch's "unexpected pos … iostream error" never names it), and `oom_killed`, whether
    the kernel's OOM killer killed a process of the worker's cgroup while this one ran."""
    failure = _reported(output_dir)
    if failure is None:
        if returncode == -signal.SIGKILL and oom_killed:
            failure = Failure(
                ErrorCode.out_of_memory,
                "the job's process was killed by the kernel's out-of-memory killer (SIGKILL)",
            )
        elif returncode < 0:
            name = signal.Signals(-returncode).name
            hint = " (out of memory?)" if -returncode == signal.SIGKILL else ""
            failure = Failure(ErrorCode.killed, f"the job's process was killed by {name}{hint}")
        else:
            failure = Failure(
                ErrorCode.killed, f"the job's process exited with status {returncode} without saying why"
            )
    unexplained = failure.code == ErrorCode.internal or (failure.code == ErrorCode.killed and returncode > 0)
    if disk is not None and disk.low and unexplained:
        failure = Failure(ErrorCode.no_space, f"{NO_SPACE_CAUSE} ({disk.describe()}): {failure.message}")
    elif failure.code == ErrorCode.no_space and not failure.message.startswith(NO_SPACE_CAUSE):
        where = f" ({disk.describe()})" if disk is not None else ""
        failure = Failure(ErrorCode.no_space, f"{NO_SPACE_CAUSE}{where}: {failure.message}")
    tail = _tail(log_path)
    cause = drop_tracebacks(failure.message)
    message = f"{cause}\n\n{TAIL_HEADING}\n{tail}" if tail else cause
    return Failure(failure.code, _clip(message))


def kernel_oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has killed in this process's memory cgroup, or
    None where it cannot be read. A rise across a job's run, with the job killed by SIGKILL, is the
    OOM killer's signature; nothing else here tells it from an operator's kill -9. cgroup v2 counts
    in memory.events, v1 in memory.oom_control (both "oom_kill N"); in a container the cgroup's own
    folder is often the mount's root, so that is tried after the path /proc names."""
    for path in _oom_counters():
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None


def _oom_counters() -> list[Path]:
    root = Path("/sys/fs/cgroup")
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        _, controllers, relative = line.split(":", 2)
        if controllers == "":  # v2
            found += [root / relative.lstrip("/") / "memory.events", root / "memory.events"]
        elif "memory" in controllers.split(","):  # v1
            found += [root / "memory" / relative.lstrip("/") / "memory.oom_control"]
            found += [root / "memory" / "memory.oom_control"]
    return found


def _reported(output_dir: Path) -> Failure | None:
    for path in sorted(log_dir(output_dir).glob("error-rank*.json")):
        try:
            body = json.loads(path.read_text())
            return Failure(
                ErrorCode(body["code"]), str(body["message"]).strip() or "failed without a message"
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def _clip(message: str) -> str:
    """Keep the head (the cause) and the tail (the log's last lines) of a long message."""
    if len(message) <= MAX_ERROR_CHARS:
        return message
    half = MAX_ERROR_CHARS // 2
    return f"{message[:half]}\n…\n{message[-half:]}"


def _tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            start = max(0, f.tell() - 8192)
            f.seek(start)
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    if start:  # the first line is cut, and may be the middle of a traceback (frames are indented)
        rest = text.splitlines()[1:]
        text = "\n".join(itertools.dropwhile(lambda line: not line.strip() or line[:1].isspace(), rest))
    # The traceback the process logged stays in the log file (the operator's): the error quotes the
    # lines around it, and frames would crowd them out of the last `lines`.
    return "\n".join(drop_tracebacks(text).splitlines()[-lines:])
