"""How a job's process tells its worker why it ended, and what kind of failure it was.

A failing process leaves `logs/error-rank<N>.json` in the job's folder: {"code", "message"}, the
code an ErrorCode (shared.core.tables). Exit statuses say the rest: PREEMPTED_EXIT (stopped on request
with a checkpoint), and a death by signal or without an error file (killed, or the interpreter
crashed). Torch-free, so the runner (which never imports torch) can read it all. The failure read
here has no traceback frames; worker/user_text.py also takes the worker's paths out before the job's
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
from worker.user_text import drop_tracebacks

LOG_DIR = "logs"
MAX_ERROR_CHARS = 4000
TAIL_LINES = 20
TAIL_HEADING = "last log lines:"  # between a failure's cause and the last lines of its log
# The job's process saved a checkpoint and stopped because it was asked to (its worker is shutting
# down): the job goes back to the queue without spending an attempt. (EX_TEMPFAIL.)
PREEMPTED_EXIT = 75

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


def write_failure(output_dir: Path, rank: int, failure: Failure) -> None:
    error_file(output_dir, rank).write_text(json.dumps({"code": failure.code, "message": failure.message}))


def clear_errors(output_dir: Path) -> None:
    for path in log_dir(output_dir).glob("error-rank*.*"):
        path.unlink(missing_ok=True)


def classify(exc: BaseException) -> ErrorCode:
    """The error code of an exception raised in a job's process."""
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


def read_failure(output_dir: Path, returncode: int, log_path: Path) -> Failure:
    """The process's own account of its failure, else what its exit status tells; with the last
    lines of its log either way."""
    failure = _reported(output_dir)
    if failure is None:
        if returncode < 0:
            name = signal.Signals(-returncode).name
            hint = " (out of memory?)" if -returncode == signal.SIGKILL else ""
            cause = f"the job's process was killed by {name}{hint}"
        else:
            cause = f"the job's process exited with status {returncode} without saying why"
        failure = Failure(ErrorCode.killed, cause)
    tail = _tail(log_path)
    cause = drop_tracebacks(failure.message)
    message = f"{cause}\n\n{TAIL_HEADING}\n{tail}" if tail else cause
    return Failure(failure.code, _clip(message))


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
