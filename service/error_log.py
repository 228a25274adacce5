"""Error log lines that are bounded in size and never quote what a request carried.

An exception's message may hold anything its code was handed: a cell of an uploaded file (a
parser's "could not convert '<100 KB>'"), a key's digest in a database driver's DETAIL, a spec. An
unexpected error is therefore logged by its exception types, the innermost frames of its traceback
and, for a failed statement, the statement's SQL (its parameters are hidden by shared/core/db.py), but
never by a message; and no line of the API's log is longer than MAX_LOG_CHARS. The API's own handlers
write such lines (service/errors.py); BoundedLines rewrites the records of everyone else that reach
the server's handlers (uvicorn's "Exception in ASGI application" traceback, a library's warning).
"""

from __future__ import annotations

import logging
import traceback
from pathlib import Path

from sqlalchemy.exc import StatementError

from shared.core.errors import shorten

MAX_LOG_CHARS = 4000
MAX_FRAMES = 8  # per exception, the innermost: where it was raised
MAX_CHAIN = 4  # exceptions followed through __cause__ / __context__
MAX_STATEMENT_CHARS = 300
MAX_PATH_CHARS = 1000  # of a request's path in an access log line
ACCESS_LOGGER = "uvicorn.access"


def describe_failure(exc: BaseException) -> str:
    """An unexpected error for the log, bounded: each exception of its chain by type and place."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(parts) < MAX_CHAIN:
        seen.add(id(current))
        frames = traceback.extract_tb(current.__traceback__)[-MAX_FRAMES:]
        where = " < ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames))
        text = f"{type(current).__module__}.{type(current).__qualname__}"
        if isinstance(current, StatementError) and current.statement:
            text += f" [{shorten(' '.join(current.statement.split()), MAX_STATEMENT_CHARS)}]"
        parts.append(f"{text} at {where or '?'}")
        current = current.__cause__ or current.__context__
    return shorten(" | from ".join(parts), MAX_LOG_CHARS // 2)


class BoundedLines(logging.Filter):
    """A handler's filter: a record with a traceback is logged with describe_failure() in its place,
    and every message is cut to MAX_LOG_CHARS."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == ACCESS_LOGGER and isinstance(record.args, tuple) and len(record.args) == 5:
            # uvicorn's access formatter reads its five arguments (client, method, path, version,
            # status) itself: only the path, the one a client chooses, is cut.
            client, method, path, version, status = record.args
            record.args = (client, method, shorten(str(path), MAX_PATH_CHARS), version, status)
            return True
        message = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            message = f"{shorten(message, 500)}: {describe_failure(record.exc_info[1])}"
            record.exc_info = None
            record.exc_text = None
        elif len(message) < MAX_LOG_CHARS:
            return True  # as it was: a formatter may read the record's own arguments
        record.msg, record.args = shorten(message, MAX_LOG_CHARS - 1), ()  # with its "…"
        return True


def install_bounded_lines(*logger_names: str) -> None:
    """BoundedLines on every handler of the root logger and of the named loggers (uvicorn's)."""
    bounded = BoundedLines()
    for name in ("", *logger_names):
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(f, BoundedLines) for f in handler.filters):
                handler.addFilter(bounded)
