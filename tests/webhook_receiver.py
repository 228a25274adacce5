"""A real webhook receiver for the tests: an HTTP server on 127.0.0.1 in a thread that records every
request (headers and body) and answers with the status codes it is told, in order."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    port: int
    answers: list[int] = field(default_factory=list)  # status codes for the next requests; then 204
    requests: list[Received] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def receiver(answers: list[int] | None = None, *, bound: socket.socket | None = None) -> Iterator[Receiver]:
    """A receiver on a port the OS picks, or on `bound`: a socket bound earlier and not yet listening
    (`reserved_port()`), so that a receiver can come up on a port that refused connections until then,
    without letting the port go meanwhile."""
    state = Receiver(port=0, answers=list(answers or []))
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            with lock:
                state.requests.append(
                    Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                )
                code = state.answers.pop(0) if state.answers else 204
            self.send_response(code)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

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
        server.shutdown()
        server.server_close()
        thread.join(5)


def reserved_port() -> socket.socket:
    """A socket bound to a port on 127.0.0.1 and not listening: connections to the port are refused
    (as to a receiver that is down) and no other process can take it. `receiver(bound=...)` serves on it."""
    reserved = socket.socket()
    reserved.bind(("127.0.0.1", 0))
    return reserved
