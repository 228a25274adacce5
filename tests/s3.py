"""A real S3 endpoint for the tests: moto's standalone server on 127.0.0.1, reached through the same
code a user's MinIO is (s3fs and botocore, with the standard AWS environment variables).

moto keeps its objects in memory, so "the store goes away and comes back" is played by the endpoint
the clients dial: a small TCP relay in front of moto that stops listening (and drops the connections
it carries) and listens again, while moto keeps the bucket.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from gluejobs.stack import free_port

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "gluejobs-test",
    "AWS_SECRET_ACCESS_KEY": "gluejobs-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class S3Endpoint:
    """moto on a port of its own, and the relay clients use (`url`), which `down()` and `up()` stop
    and start."""

    def __init__(self, log: Path) -> None:
        self._moto_port = free_port()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        with log.open("ab") as output:
            self._moto = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self._moto_port)],
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{self._moto_port}/", timeout=2)
                break
            except httpx.HTTPError:
                if self._moto.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto's server did not start; see {log}") from None
                time.sleep(0.2)
        self._listener: socket.socket | None = None
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.up()

    def environment(self) -> dict[str, str]:
        """What a process needs to reach the store (the standard AWS variables)."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": self.url}

    # --- the relay ------------------------------------------------------------------------------

    def up(self) -> None:
        if self._listener is not None:
            return
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        """Connections refused from now on, and those open cut."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._lock:
            for connection in self._connections:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
                connection.close()
            self._connections.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by down()
            upstream = socket.create_connection(("127.0.0.1", self._moto_port))
            with self._lock:
                self._connections |= {client, upstream}
            threading.Thread(target=self._relay, args=(client, upstream), daemon=True).start()

    def _relay(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while True:
                ready, _, _ = select.select([a, b], [], [], 1.0)
                for source in ready:
                    data = source.recv(1 << 16)
                    if not data:
                        return
                    (b if source is a else a).sendall(data)
        except (OSError, ValueError):
            return
        finally:
            with self._lock:
                self._connections -= {a, b}
            a.close()
            b.close()

    def close(self) -> None:
        self.down()
        self._moto.terminate()
        try:
            self._moto.wait(10)
        except subprocess.TimeoutExpired:
            self._moto.kill()


def use_endpoint(endpoint: S3Endpoint, environ: dict[str, str] | None = None) -> None:
    """Point this process (its s3fs clients, and the processes it starts) at the endpoint."""
    (environ if environ is not None else os.environ).update(endpoint.environment())
