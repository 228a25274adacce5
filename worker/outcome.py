"""How a job's child tells its runner why it failed: files in the job's output folder.

Torch-free, so the runner (which never imports torch) can read them.
"""

from __future__ import annotations

import signal
from pathlib import Path

LOG_DIR = "logs"
MAX_ERROR_CHARS = 4000


def log_dir(output_dir: Path) -> Path:
    return output_dir / LOG_DIR


def error_file(output_dir: Path, rank: int) -> Path:
    folder = log_dir(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"error-rank{rank}.txt"


def clear_errors(output_dir: Path) -> None:
    for path in log_dir(output_dir).glob("error-rank*.txt"):
        path.unlink(missing_ok=True)


def failure_message(output_dir: Path, returncode: int, log_path: Path) -> str:
    """The child's own account of its failure, else what its exit status and log tell."""
    errors = sorted(log_dir(output_dir).glob("error-rank*.txt"))
    if errors:
        message = errors[0].read_text().strip()
        return message[:MAX_ERROR_CHARS] or "the job failed without a message"
    if returncode < 0:
        name = signal.Signals(-returncode).name
        hint = " (killed: out of memory?)" if -returncode == signal.SIGKILL else ""
        cause = f"the job's process was killed by {name}{hint}"
    else:
        cause = f"the job's process exited with status {returncode}"
    tail = _tail(log_path)
    return f"{cause}; last log lines:\n{tail}"[:MAX_ERROR_CHARS] if tail else cause


def _tail(path: Path, lines: int = 15) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 8192))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
