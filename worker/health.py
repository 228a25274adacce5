"""`gluejobs worker --health-port N`: what an orchestrator asks a worker.

GET /healthz: 200 while the process runs (liveness: restart it only when this fails).
GET /readyz: 200 when the worker reaches its database; 503 with {"status": "waiting"} while it
waits for the database to come back (it is not dead: do not restart it, its jobs keep training).
Both answer JSON with the worker's id, state and running jobs.

The standard library's HTTP server on a daemon thread: no dependency, nothing to install on a
worker image.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

logger = logging.getLogger(__name__)


class HealthServer:
    def __init__(self, port: int, status: Callable[[], dict[str, Any]], host: str = "0.0.0.0") -> None:
        self._status = status

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
                    ready = bool(body.get("database_reachable"))
                    self._answer(200 if ready else 503, {**body, "status": "ok" if ready else "waiting"})

            def _answer(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body, default=str).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                logger.debug("health: " + format, *args)

        self._server = ThreadingHTTPServer((host, port), Handler)
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
