"""The API while its database is away: 503 with Retry-After for each request, one log line per outage.

A request that needs the database while it cannot be reached (Postgres refusing connections or
restarting, SQLite's write lock held past its busy timeout, its file gone) answers
503 `database_unavailable` with `Retry-After`, so a client can tell "try again in a moment" from "the
server is broken". The answer comes from the app's exception handlers, never from uvicorn's last
resort (which logs a traceback and closes the connection): a keep-alive connection stays usable.

The outage is logged as it starts and as it ends, once each, however many requests it refused. The
engine's own events tell: `handle_error` for every failed statement or connection attempt, and
`after_cursor_execute` for every statement that worked. Where only some statements fail (SQLite: a
held write lock refuses writes while reads go on), the outage ends only after QUIET_S without a
failure, so it is not logged as a hundred short ones.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from sqlalchemy import Engine, event

from shared.core.db_retries import is_transient

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 2
QUIET_S = 5.0
DATABASE_UNAVAILABLE = "database_unavailable"
UNAVAILABLE_MESSAGE = "the database cannot be reached right now; try again shortly"


class DatabaseOutage:
    """Whether the database is away, as far as this process has seen; thread-safe (routes run in a pool)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.down_since: float | None = None
        self._last_failure = 0.0
        self.refused = 0

    def failed(self, exc: BaseException) -> None:
        now = time.monotonic()
        with self._lock:
            self._last_failure = now
            if self.down_since is not None:
                return
            self.down_since, self.refused = now, 0
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0][:300]
        logger.warning(
            "database unreachable (%s: %s): requests that need it get 503 until it is back",
            type(exc).__name__,
            reason,
        )

    def succeeded(self) -> None:
        if self.down_since is None:  # the usual case: no lock on the way of every statement
            return
        now = time.monotonic()
        with self._lock:
            if self.down_since is None or now - self._last_failure < QUIET_S:
                return
            seconds, refused = self._last_failure - self.down_since, self.refused
            self.down_since = None
        logger.warning(
            "database reachable again: it failed for %.1f s, and %d request(s) got 503", seconds, refused
        )

    def count_refusal(self) -> None:
        with self._lock:
            self.refused += 1


def watch(engine: Engine) -> DatabaseOutage:
    """An outage record fed by `engine`'s events."""
    outage = DatabaseOutage()

    @event.listens_for(engine, "handle_error")
    def _on_error(context: Any) -> None:
        error = context.sqlalchemy_exception or context.original_exception
        if error is not None and is_transient(error):
            outage.failed(error)

    @event.listens_for(engine, "after_cursor_execute")
    def _on_statement(*_args: Any) -> None:
        outage.succeeded()

    return outage
