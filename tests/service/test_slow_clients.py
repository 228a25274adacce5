"""Slow and idle clients cannot exhaust the API: raw sockets that send their request head or body a
byte a second, against `python -m service` in its own process (uvicorn with the connection guard),
whose open file descriptors are counted in /proc/<pid>/fd."""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.e2e import api_process

pytestmark = pytest.mark.e2e

SLOW_CLIENTS = 300
MAX_CONNECTIONS = 100
# Descriptors the API may open besides its client connections while the test runs (database, logs).
FD_SLACK = 30


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def address(client: httpx.Client) -> tuple[str, int]:
    url = client.base_url
    return str(url.host), int(url.port or 80)


class Trickler:
    """A connection that sends `data` one byte per call of `step`, reopened when the server closes it."""

    def __init__(self, where: tuple[str, int], data: bytes) -> None:
        self.where, self.data = where, data
        self.closed_by_server = 0
        self._open()

    def _open(self) -> None:
        self.sock = socket.create_connection(self.where, timeout=5)
        self.sock.setblocking(False)
        self.sent = 0

    def step(self) -> None:
        try:
            if self.sock.recv(4096, socket.MSG_PEEK) == b"":
                raise ConnectionResetError  # the server closed it
        except BlockingIOError:
            pass  # nothing to read: still open
        except OSError:
            self._reopen()
            return
        try:
            self.sock.send(self.data[self.sent % len(self.data) : self.sent % len(self.data) + 1])
            self.sent += 1
        except OSError:
            self._reopen()

    def _reopen(self) -> None:
        self.closed_by_server += 1
        self.sock.close()
        self._open()

    def close(self) -> None:
        self.sock.close()


def wait_closed(sock: socket.socket, timeout_s: float) -> tuple[float, bytes]:
    """Seconds until the server closed `sock`, and what it sent before closing."""
    sock.settimeout(0.2)
    start, received = time.monotonic(), b""
    while time.monotonic() - start < timeout_s:
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            try:
                sock.send(b"x")  # keep trickling, as the attacker would
            except OSError:
                return time.monotonic() - start, received
            continue
        except OSError:
            return time.monotonic() - start, received
        if not chunk:
            return time.monotonic() - start, received
        received += chunk
    raise AssertionError(f"the server kept the connection open for {timeout_s} s; it sent {received!r}")


def test_hundreds_of_slow_clients_neither_block_a_normal_client_nor_hold_descriptors(
    settings_factory: Any, sqlite_url: str, tmp_path: Path
) -> None:
    settings = settings_factory(
        sqlite_url, max_connections=MAX_CONNECTIONS, header_timeout_s=4, client_log_interval_s=2
    )
    log = tmp_path / "api.log"
    with api_process(settings, log=log) as (client, process):
        where = address(client)
        assert client.get("/v1/jobs").status_code == 200
        baseline = open_descriptors(process.pid)
        head = f"GET /v1/jobs HTTP/1.1\r\nHost: {where[0]}\r\nX-Pad: {'a' * 2000}".encode()
        slow = [Trickler(where, head) for _ in range(SLOW_CLIENTS)]
        latencies, peak = [], 0
        try:
            end = time.monotonic() + 10
            while time.monotonic() < end:
                started = time.monotonic()
                for trickler in slow:
                    trickler.step()
                for _ in range(20):  # garbage, which used to cost a warning line each in the log
                    with socket.create_connection(where) as garbage:
                        garbage.sendall(b"NOT HTTP AT ALL\r\n\r\n")
                with httpx.Client(base_url=client.base_url, timeout=10) as normal:  # a fresh connection
                    asked = time.monotonic()
                    response = normal.get("/v1/jobs")
                    latencies.append(time.monotonic() - asked)
                assert response.status_code == 200, response.text
                peak = max(peak, open_descriptors(process.pid))
                time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
        finally:
            for trickler in slow:
                trickler.close()
        closed = sum(t.closed_by_server for t in slow)
        assert max(latencies) < 1.0, latencies
        assert peak <= baseline + MAX_CONNECTIONS + FD_SLACK, (baseline, peak)
        assert closed >= SLOW_CLIENTS - MAX_CONNECTIONS  # the API let go of the slow ones
        # Back to normal once they are gone.
        assert client.get("/v1/jobs").status_code == 200
        time.sleep(2.5)  # one more interval: its summary line is written
    text = log.read_text()
    assert "Invalid HTTP request received" not in text
    summaries = [line for line in text.splitlines() if "slow or broken clients" in line]
    # One line when the attack starts, then at most one per 2-second interval: not one per connection.
    assert 1 <= len(summaries) <= 10, summaries
    assert any("waiting connections closed to make room at the 100-connection limit" in s for s in summaries)
    assert any("malformed requests answered 400" in s for s in summaries)


def test_a_request_head_sent_a_byte_a_second_is_cut_off(
    settings_factory: Any, sqlite_url: str, tmp_path: Path
) -> None:
    settings = settings_factory(sqlite_url, header_timeout_s=2)
    with api_process(settings) as (client, _):
        where = address(client)
        for first_bytes in (b"", b"GET /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n"):
            sock = socket.create_connection(where)
            sock.sendall(first_bytes)
            seconds, received = wait_closed(sock, timeout_s=15)
            sock.close()
            assert seconds < 5, seconds
            assert received == b""  # no request, no answer
        # A keep-alive connection that trickles its second request is cut off too.
        sock = socket.create_connection(where)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        first = sock.recv(4096)
        assert first.startswith(b"HTTP/1.1 200"), first
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        seconds, _ = wait_closed(sock, timeout_s=15)
        sock.close()
        assert seconds < 5, seconds


def test_a_body_sent_a_byte_a_second_gets_408(settings_factory: Any, sqlite_url: str) -> None:
    settings = settings_factory(sqlite_url, body_timeout_s=2)
    with api_process(settings) as (client, _):
        sock = socket.create_connection(address(client))
        sock.sendall(
            b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 200\r\n\r\n{"
        )
        seconds, received = wait_closed(sock, timeout_s=15)
        sock.close()
        assert seconds < 5, seconds
        assert received.startswith(b"HTTP/1.1 408 "), received
        assert re.search(rb"connection: close", received, re.IGNORECASE)
        assert b'"code":"request_timeout"' in received
        assert b"did not arrive within 2 s" in received
        # A stream outlives the body's clock, which stops once the whole body has arrived (a GET's
        # at once): past 2 s it is still open and sends its keep-alive comment (every 5 s).
        job = client.post("/v1/jobs", json={"spec": {"model_name_or_path": "tiny-bert", "task_name": "sst2"}})
        assert job.status_code == 201, job.text
        comments = []
        with client.stream("GET", f"/v1/jobs/{job.json()['id']}/stream") as stream:
            assert stream.status_code == 200
            for line in stream.iter_lines():
                if line.startswith(":"):
                    comments.append(line)
                if len(comments) == 2:
                    break
        assert comments[1] == ": keep-alive", comments
