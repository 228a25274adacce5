"""An S3 endpoint on this machine for the object-store tests and benchmarks: moto's standalone server
(`pip install "gluejobs-server[s3-test]"`) behind a relay that can take the store away and bring it
back. Test support only: neither distribution ships it (bench/ imports it from here).
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from gluejobs_server.stack import free_port

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "gluejobs-test",
    "AWS_SECRET_ACCESS_KEY": "gluejobs-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}
MOTO_START_TRIES = 3
MOTO_READY_S = 60.0
# SO_LINGER on, zero seconds: close() sends a reset, as a store that is away does (no FIN, no bytes).
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)


class S3Endpoint:
    """moto's S3 server on a port of its own, reached through a relay on `url`: the same client code
    as a user's MinIO talks to it (s3fs and botocore, with the standard AWS variables of
    `environment()`). moto keeps its objects in memory, so "the store goes away and comes back" is the
    relay's: `down()` cuts the connections it carries and resets every new one until `up()`, while
    moto keeps the bucket.

    The relay holds its listening socket from start to close(), through every outage: a port let go
    and bound again may have been taken meanwhile by another process (a suite under load once failed
    with "Address already in use" that way)."""

    def __init__(self, log: Path) -> None:
        self._moto, self._moto_port = _start_moto(log)
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))  # the OS's pick, held: no probe-then-bind race
        self._listener.listen(64)
        self.port = int(self._listener.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._available = True
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def environment(self) -> dict[str, str]:
        """What a process needs to reach the store (the standard AWS variables)."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": self.url}

    def up(self) -> None:
        with self._lock:
            self._available = True

    def down(self) -> None:
        """Connections reset from now on, and those open cut."""
        with self._lock:
            self._available = False
            for connection in self._connections:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
                connection.close()
            self._connections.clear()

    def close(self) -> None:
        self.down()
        self._listener.close()  # the accept loop ends
        self._moto.terminate()
        try:
            self._moto.wait(10)
        except subprocess.TimeoutExpired:
            self._moto.kill()

    # --- the relay ------------------------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed by close()
            with self._lock:  # one step with down(): no connection slips past its cut
                try:
                    if not self._available:
                        raise ConnectionRefusedError
                    upstream = socket.create_connection(("127.0.0.1", self._moto_port))
                except OSError:
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
                    client.close()
                    continue
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


def _start_moto(log: Path) -> tuple[subprocess.Popen[bytes], int]:
    """moto's server and its port. moto binds a port it is given, so another process may take that
    port between the pick and the bind: moto then exits, and another port is tried."""
    for _ in range(MOTO_START_TRIES):
        port = free_port()
        with log.open("ab") as output:
            moto = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        if _moto_ready(moto, port):
            return moto, port
        moto.kill()
        moto.wait()
    raise RuntimeError(f"moto's server did not start in {MOTO_START_TRIES} tries; see {log}")


def _moto_ready(moto: subprocess.Popen[bytes], port: int) -> bool:
    """Whether moto answers on `port` (its own API there, not whatever else might listen on it)."""
    deadline = time.monotonic() + MOTO_READY_S
    while moto.poll() is None and time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/moto-api/data.json", timeout=2).status_code == 200:
                return moto.poll() is None
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False
