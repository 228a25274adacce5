"""What a slow, idle or broken client may hold of the API: bounded connections, bounded header time,
and one log line per interval about them instead of one per connection.

uvicorn bounds an idle keep-alive connection (timeout_keep_alive) and the size of a request head
(h11_max_incomplete_event_size), but not the time a client takes to send that head: a client that
sends a byte a second, or connects and says nothing, holds a file descriptor for ever. Its
`limit_concurrency` does not help either: once the open connections reach it, it answers 503 to every
new *request* — so the slow clients that hold those connections shut out everyone else, which is
the attack itself. Hence this protocol, a subclass of uvicorn's h11 protocol (the one installed;
`gluejobs serve` passes it to uvicorn as `http=`), which adds two rules:

- a connection that waits for a request head (a new connection, or a keep-alive one between two
  requests) longer than GLUEJOBS_HEADER_TIMEOUT_S is closed;
- at most GLUEJOBS_MAX_CONNECTIONS connections are open: at the limit, a new connection closes the
  one that has been waiting for its request head the longest (a normal client sends its head in
  milliseconds, so that is a slow or idle client), and only when every open connection is busy with
  a request is the new one refused with a 503.

A connection whose body arrives slowly is the request guard's to bound (service/edge/guard.py): by then
the app is running and can answer 408.

The hooks are uvicorn's own protocol methods (connection_made, connection_lost, handle_events,
on_response_complete), its `cycle`, `loop` and `transport` attributes and its log line for a malformed
request, none of them public API. They hold in the uvicorn releases UVICORN_REQUIREMENT names
(server/pyproject.toml pins the same range), and `check_uvicorn_hooks` checks at import that the
installed one still has them, so an upgrade that moved them fails at start-up with the version named,
not later with connections silently unguarded. tests/service/test_slow_clients.py drives them through real
sockets.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter, OrderedDict
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

logger = logging.getLogger(__name__)

HEADER_TIMEOUT = "header_timeout"
EVICTED = "evicted"
REFUSED = "refused"
INVALID_REQUEST = "invalid_request"
ACCEPT_FAILED = "accept_failed"
_DESCRIPTIONS = {
    HEADER_TIMEOUT: "connections closed for sending no complete request head within {header_timeout_s:g} s",
    EVICTED: "waiting connections closed to make room at the {max_connections}-connection limit",
    REFUSED: "connections refused (503) with all {max_connections} connections busy",
    INVALID_REQUEST: "malformed requests answered 400",
    ACCEPT_FAILED: "failed accept() calls (out of file descriptors)",
}
RETRY_AFTER_S = 1
# The uvicorn releases whose H11Protocol this module was written and tested against (the server's
# requirement in server/pyproject.toml says the same; a test keeps them equal).
UVICORN_REQUIREMENT = "uvicorn>=0.30,<0.56"
INVALID_REQUEST_MESSAGE = "Invalid HTTP request received."
# What of uvicorn's protocol this module relies on: the methods it overrides, the attributes it
# reads (by the methods that set them), and the log line it counts instead of printing.
OVERRIDDEN = ("connection_made", "connection_lost", "handle_events", "on_response_complete")
ATTRIBUTES_SET_BY = {"__init__": ("loop", "cycle"), "connection_made": ("transport",)}


class UnsupportedUvicorn(RuntimeError):
    """The installed uvicorn lacks a non-public hook this module relies on."""


def check_uvicorn_hooks(
    protocol: type = H11Protocol, cycle: type = RequestResponseCycle, installed: str | None = None
) -> None:
    """UnsupportedUvicorn, naming the installed version, unless `protocol` has every hook."""
    missing = [f"method {name}" for name in OVERRIDDEN if not callable(getattr(protocol, name, None))]
    for method, attributes in ATTRIBUTES_SET_BY.items():
        code = getattr(getattr(protocol, method, None), "__code__", None)
        names = set(code.co_names) if code is not None else set()
        missing += [f"attribute {name} (set by {method})" for name in attributes if name not in names]
    init = getattr(getattr(cycle, "__init__", None), "__code__", None)
    if init is None or "response_complete" not in init.co_names:
        missing.append("attribute cycle.response_complete")
    handle = getattr(getattr(protocol, "handle_events", None), "__code__", None)
    if handle is None or INVALID_REQUEST_MESSAGE not in handle.co_consts:
        missing.append(f"log message {INVALID_REQUEST_MESSAGE!r} (in handle_events)")
    if missing:
        raise UnsupportedUvicorn(
            f"uvicorn {installed or version('uvicorn')} is installed, but service/edge/connections.py "
            f"overrides uvicorn's h11 protocol as {UVICORN_REQUIREMENT} has it, and this one lacks: "
            f"{'; '.join(missing)}. Install {UVICORN_REQUIREMENT!r} (what gluejobs-server requires), "
            "or update service/edge/connections.py to this uvicorn"
        )


check_uvicorn_hooks()


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    header_timeout_s: float
    log_interval_s: float


class ClientEventLog:
    """Counts slow-client events and logs them as one summary line per interval.

    The first event after a quiet interval is logged at once (so an operator sees an attack start);
    the rest are counted and summed up when the interval ends. Every caller runs on the event loop.
    """

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.counts: Counter[str] = Counter()
        self._flush: asyncio.TimerHandle | None = None

    def note(self, kind: str) -> None:
        if self._flush is None:
            self._log(Counter({kind: 1}), "")
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # not on the event loop: that one line is all
            self._flush = loop.call_later(self.limits.log_interval_s, self._end_interval)
            return
        self.counts[kind] += 1

    def _end_interval(self) -> None:
        counts, self.counts = self.counts, Counter()
        if counts:
            self._log(counts, f" in the last {self.limits.log_interval_s:g} s")
            self._flush = asyncio.get_running_loop().call_later(
                self.limits.log_interval_s, self._end_interval
            )
        else:
            self._flush = None

    def _log(self, counts: Counter[str], period: str) -> None:
        values = {
            "header_timeout_s": self.limits.header_timeout_s,
            "max_connections": self.limits.max_connections,
        }
        parts = [f"{n} {_DESCRIPTIONS[kind].format(**values)}" for kind, n in sorted(counts.items())]
        logger.warning("slow or broken clients%s: %s", period, "; ".join(parts))


class CountedMessages(logging.Filter):
    """Moves uvicorn's and asyncio's one-line-per-event messages about broken clients into the summary."""

    def __init__(self, events: ClientEventLog, messages: dict[str, str]) -> None:
        super().__init__()
        self.events = events
        self.messages = messages

    def filter(self, record: logging.LogRecord) -> bool:
        kind = self.messages.get(str(record.msg))
        if kind is None:
            return True
        self.events.note(kind)
        return False


def install_log_filters(events: ClientEventLog) -> None:
    logging.getLogger("uvicorn.error").addFilter(
        CountedMessages(events, {INVALID_REQUEST_MESSAGE: INVALID_REQUEST})
    )
    # asyncio logs this with a traceback on every failed accept() (EMFILE), then pauses accepting.
    logging.getLogger("asyncio").addFilter(
        CountedMessages(events, {"socket.accept() out of system resource": ACCEPT_FAILED})
    )


def _refusal() -> bytes:
    body = json.dumps(
        {"error": {"code": "too_many_connections", "message": "the API has no free connection; try again"}}
    ).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        f"retry-after: {RETRY_AFTER_S}\r\nconnection: close\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def guarded_protocol(limits: ConnectionLimits, events: ClientEventLog) -> type[H11Protocol]:
    """An h11 protocol class for one server, with its own connection table."""
    # Connections waiting for a request head, the longest-waiting first; every open connection.
    waiting: OrderedDict[GuardedH11Protocol, None] = OrderedDict()
    open_connections: set[GuardedH11Protocol] = set()

    class GuardedH11Protocol(H11Protocol):
        _head_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if len(open_connections) >= limits.max_connections and not self._evict_longest_waiting():
                events.note(REFUSED)
                transport.write(_refusal())
                transport.close()
                return
            open_connections.add(self)
            self._wait_for_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_waiting()
            open_connections.discard(self)
            super().connection_lost(exc)

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and not self.cycle.response_complete:
                self._stop_waiting()  # a request head arrived: the app has the request now

        def on_response_complete(self) -> None:
            # Before uvicorn's own handler, which may start a pipelined request (and stop the wait).
            if not self.transport.is_closing():
                self._wait_for_head()
            super().on_response_complete()

        def _wait_for_head(self) -> None:
            self._stop_waiting()
            waiting[self] = None
            self._head_deadline = self.loop.call_later(limits.header_timeout_s, self._head_too_slow)

        def _stop_waiting(self) -> None:
            waiting.pop(self, None)
            if self._head_deadline is not None:
                self._head_deadline.cancel()
                self._head_deadline = None

        def _head_too_slow(self) -> None:
            if self in waiting:
                events.note(HEADER_TIMEOUT)
                self._close_now()

        def _evict_longest_waiting(self) -> bool:
            if not waiting:
                return False
            victim = next(iter(waiting))
            events.note(EVICTED)
            victim._close_now()
            return True

        def _close_now(self) -> None:
            # abort(), not close(): nothing is owed to a client that never finished its request, and
            # the descriptor is released at once (close() waits for buffered writes).
            self._stop_waiting()
            open_connections.discard(self)
            self.transport.abort()

    return GuardedH11Protocol
