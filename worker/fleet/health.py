"""`gluejobs worker --health-port N`: what an orchestrator asks a worker.

GET /healthz: 200 while the process runs (liveness: restart it only when this fails).
GET /readyz: 200 when the worker's last round trip to its database succeeded; 503 with
{"status": "database_unreachable"} when it failed — the worker waits for the database to come back
(it is not dead: do not restart it, its jobs keep training); 503 with {"status": "warming_up"} while
it starts (its schema check, its store, its warm-start template: "warming_up" says which), its
database reachable all the while or not yet asked; 503 with {"status": "low_disk"} when its job disk
is below GLUEJOBS_WORKER_MIN_FREE_BYTES (it claims nothing until it has room; free some, or it
waits). Both answer JSON with the worker's id, state, disk and running jobs.

The standard library's HTTP server on a daemon thread: no dependency, nothing to install on a
worker image.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from shared.core.db import Database
from shared.core.db_retries import is_transient

logger = logging.getLogger(__name__)


class DatabaseWatch:
    """The worker's database, and whether its last round trip reached it (what /readyz answers).

    Every access of the worker goes through `session()`: its loop's claim, lease recovery and own
    heartbeat, each running job's heartbeat, each outcome it records. The round trip that ended last
    decides: one that failed for want of the database (shared.core.db_retries.is_transient: away, or
    locked past the busy timeout) makes the worker not ready, the next one that reached it (with an
    answer, or with an error the database itself gave) ready again. A busy worker's loop may not
    touch the database for a while, but each job's heartbeat does every GLUEJOBS_HEARTBEAT_S, so
    /readyz follows an outage within one heartbeat. (A job's own rows are written by its process,
    whose flusher the worker does not see; the heartbeat reaches the same database meanwhile.)
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        self._lock = threading.Lock()
        self._reachable: bool | None = None  # None: no round trip has told yet

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.round_trip(), self.db.session() as session:
            yield session

    @contextmanager
    def round_trip(self) -> Iterator[None]:
        """Records whether what runs inside reached the database (for work that is no session of its
        own: the start-up migration)."""
        try:
            yield
        except Exception as exc:
            self._record(not is_transient(exc))
            raise
        self._record(True)

    def probe(self) -> bool:
        """One `SELECT 1`: whether the database answers now (recorded as any round trip is)."""
        try:
            with self.session() as session, session.begin():
                session.execute(text("SELECT 1"))
        except Exception as exc:
            if not is_transient(exc):
                raise
            return False
        return True

    @property
    def reachable(self) -> bool:
        with self._lock:
            return bool(self._reachable)

    @property
    def unreachable(self) -> bool:
        """Whether the last round trip failed for want of the database (False before the first)."""
        with self._lock:
            return self._reachable is False

    def _record(self, reached: bool) -> None:
        with self._lock:
            self._reachable = reached


class Warming:
    """What a starting worker is still doing before it claims (/readyz: `warming_up`, and which)."""

    def __init__(self, doing: str | None = "starting") -> None:
        self._doing = doing

    def now(self, doing: str | None) -> None:
        self._doing = doing  # one reference, swapped whole: read from the health thread unlocked

    def __call__(self) -> str | None:
        return self._doing


def readiness(body: dict[str, Any], database: DatabaseWatch | None, warming: str | None) -> dict[str, Any]:
    """The /readyz answer's body for the worker's status `body`: `database_unreachable` only when
    its last round trip failed, `warming_up` (with what) while it starts or before any round trip
    has told, else `ok`. A worker that warms up does so whether its database answers or not: the
    database's word comes first."""
    if database is not None and database.unreachable:
        return {**body, "status": "database_unreachable"}
    if warming is not None:
        return {**body, "status": "warming_up", "warming_up": warming}
    if not body.get("database_reachable"):
        return {**body, "status": "warming_up", "warming_up": "its first round trip to the database"}
    return {**body, "status": "ok"}


class _QuietServer(ThreadingHTTPServer):
    """A probe that gives up before its answer (a load balancer's timeout, `curl -m`) is normal client
    behaviour: one INFO line, not socketserver's traceback on stderr (issue 34 item 5). Anything else
    still goes to the log with its traceback."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        failure = sys.exc_info()[1]
        if isinstance(failure, ConnectionError):  # BrokenPipeError, ConnectionResetError, ...
            logger.info("health: a probe from %s left before its answer", client_address[0])
            return
        logger.exception("health: a probe from %s failed", client_address[0])


class HealthServer:
    def __init__(
        self,
        port: int,
        status: Callable[[], dict[str, Any]],
        host: str = "0.0.0.0",
        *,
        database: DatabaseWatch | None = None,
        warming: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._status = status
        self._database = database
        self._warming = warming

        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path not in ("/healthz", "/readyz"):
                    self._answer(404, {"error": {"code": "not_found", "message": f"no route {path}"}})
                    return
                body = outer._status()
                if path == "/healthz":
                    self._answer(200, {**body, "status": "ok"})
                else:
                    answer = readiness(body, outer._database, outer._warming())
                    ready, status = answer["status"] == "ok", answer["status"]
                    if ready and body.get("low_disk"):
                        ready, status = False, "low_disk"
                    self._answer(200 if ready else 503, {**answer, "status": status})

            def _answer(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body, default=str).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                logger.debug("health: " + format, *args)

        self._server = _QuietServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="gluejobs-health", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> HealthServer:
        self._thread.start()
        logger.info("health on port %d (/healthz, /readyz)", self.port)
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
