"""A real webhook receiver for the tests: an HTTP server on 127.0.0.1 in a thread that records every
request (headers and body) and answers with the status codes it is told, in order; or a slow one
(`drip=`) that answers a byte at a time, forever, as the receiver of issue 32 did."""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.monotonic)  # when the body was in
    ended_at: float | None = None  # when the answer ended (the sender went away, for a dripping one)


@dataclass
class Receiver:
    port: int
    answers: list[int] = field(default_factory=list)  # status codes for the next requests; then 204
    requests: list[Received] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def receiver(
    answers: list[int] | None = None,
    *,
    bound: socket.socket | None = None,
    drip: Literal["headers", "body"] | None = None,
    drip_s: float = 1.0,
) -> Iterator[Receiver]:
    """A receiver on a port the OS picks, or on `bound`: a socket bound earlier and not yet listening
    (`reserved_port()`), so that a receiver can come up on a port that refused connections until then,
    without letting the port go meanwhile. `drip="headers"`: the status line a byte every `drip_s`,
    never finished; `drip="body"`: a 200 and its headers at once, then a body promised a megabyte
    long, a byte every `drip_s`. Either goes on until the sender hangs up or the receiver stops."""
    state = Receiver(port=0, answers=list(answers or []))
    lock = threading.Lock()
    stopping = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            request = Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            with lock:
                state.requests.append(request)
                code = state.answers.pop(0) if state.answers else 204
            if drip is not None:
                self._drip(drip)
                request.ended_at = time.monotonic()
                return
            self.send_response(code)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

        def _drip(self, where: str) -> None:
            if where == "body":
                self.send_response(200)
                self.send_header("content-length", str(1024 * 1024))
                self.end_headers()
            # Headers: a status line, then a header that never ends.
            head = itertools.chain(b"HTTP/1.1 200 OK\r\nx-slow: ", itertools.repeat(ord("a")))
            trickle = head if where == "headers" else iter(b"." * 1024 * 1024)
            try:
                while not stopping.wait(drip_s) and not self._hung_up():
                    self.wfile.write(bytes([next(trickle)]))
            except (OSError, StopIteration):
                pass  # the sender hung up (a write to it failed)
            self.close_connection = True

        def _hung_up(self) -> bool:
            # A sender that hung up leaves the socket readable with nothing in it.
            try:
                return self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
            except BlockingIOError:
                return False

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler, bind_and_activate=bound is None)
    if bound is not None:
        server.socket.close()
        server.socket = bound
        server.server_address = bound.getsockname()
        server.server_activate()  # listen(): from now on connections are accepted
    state.port = server.server_address[1]
    # shutdown() waits for serve_forever's next look at its flag: half a second by default, which
    # was most of each test that starts one of these.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        stopping.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


def reserved_port() -> socket.socket:
    """A socket bound to a port on 127.0.0.1 and not listening: connections to the port are refused
    (as to a receiver that is down) and no other process can take it. `receiver(bound=...)` serves on it."""
    reserved = socket.socket()
    reserved.bind(("127.0.0.1", 0))
    return reserved
