"""A scripted HTTP server for the client's tests: real sockets on 127.0.0.1, a thread, and answers
written byte by byte — what a malicious, spoofed or failing API would send (crafted listings and
tar streams, endless bodies, connections cut mid-event, 503 during an outage). Not a MockTransport:
the client's own httpx transport, parser and timeouts are what is tested."""

from __future__ import annotations

import contextlib
import io
import json
import tarfile
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Script = Callable[["Exchange"], None]


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class Recorder:
    requests: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def paths(self) -> list[str]:
        with self.lock:
            return [r.path for r in self.requests]


class Exchange(BaseHTTPRequestHandler):
    """One request; the test's script writes the answer with the helpers below."""

    protocol_version = "HTTP/1.1"
    server: _Server

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(length)
        self._handle()

    def _handle(self) -> None:
        with self.server.recorder.lock:
            self.server.recorder.requests.append(Seen(self.command, self.path, dict(self.headers.items())))
        # The client may hang up mid-answer: what a client refusing an answer does.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.server.script(self)
        self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # --- answers -------------------------------------------------------------------------------

    def head(
        self, status: int, content_type: str, headers: dict[str, str] | None = None, **more: str
    ) -> None:
        lines = [f"HTTP/1.1 {status} X", f"Content-Type: {content_type}", "Connection: close"]
        lines += [f"{k}: {v}" for k, v in {**(headers or {}), **more}.items()]
        self.wfile.write(("\r\n".join(lines) + "\r\n\r\n").encode())

    def send(self, status: int, body: bytes, content_type: str, **headers: str) -> None:
        self.head(status, content_type, headers, **{"Content-Length": str(len(body))})
        self.wfile.write(body)

    def json(self, body: Any, status: int = 200, **headers: str) -> None:
        self.send(status, json.dumps(body).encode(), "application/json", **headers)

    def chunked(self, pieces: Iterable[bytes], content_type: str, *, complete: bool = True) -> None:
        """A chunked body; `complete=False` cuts the connection before its last chunk, as a dying
        server or a broken network does."""
        self.head(200, content_type, {"Transfer-Encoding": "chunked"})
        for piece in pieces:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.flush()
        if complete:
            self.wfile.write(b"0\r\n\r\n")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    script: Script
    recorder: Recorder


@contextmanager
def scripted_server(script: Script) -> Iterator[tuple[str, Recorder]]:
    """The server's base URL and what it received, while the block runs."""
    server = _Server(("127.0.0.1", 0), Exchange)
    server.script = script
    server.recorder = Recorder()
    # shutdown() waits for serve_forever's next look at its flag: half a second by default, which
    # was most of each test that starts one of these.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.recorder
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def endless(piece: bytes) -> Iterator[bytes]:
    while True:
        yield piece


def sse(event: str, data: Any, event_id: str) -> bytes:
    return f"id: {event_id}\nevent: {event}\ndata: {json.dumps(data)}\n\n".encode()


@dataclass(frozen=True)
class Member:
    """A tar member as a hostile server would craft it."""

    name: str
    data: bytes = b""
    kind: bytes = tarfile.REGTYPE
    linkname: str = ""


def tar_of(members: Iterable[Member]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for member in members:
            info = tarfile.TarInfo(member.name)
            info.type, info.linkname, info.size, info.mode = (
                member.kind,
                member.linkname,
                len(member.data),
                0o644,
            )
            archive.addfile(info, io.BytesIO(member.data) if member.kind == tarfile.REGTYPE else None)
    return buffer.getvalue()
