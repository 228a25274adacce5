"""What the sync and async clients share, written once and doing no I/O (the "sans-I/O" style of
h11 and httpcore): how a request is described, whether and when it is sent again, how an answer is
read within its size cap, how cursor pages follow each other, how Server-Sent Events are parsed,
and the bookkeeping that carries a stream across dropped connections and API outages. client.py
adds the I/O, a few lines per client class; everything here is tested without a network.

Retry rules (after openai-python's `_should_retry`/`_calculate_retry_timeout`):
- 429 and 503 say "not now, come back later" (a rate limit, a quota of dry runs, a database
  away): the server did nothing, so any request is sent again, after the `Retry-After` it asks for
  (seconds or an HTTP date, capped at RETRY_AFTER_MAX_S per wait, so `retries` bounds the whole
  wait) or the client's own backoff, whichever is longer; once the retries are spent, the error
  says how many tries were refused;
- 500, 502, 504 and a connection lost after the request went out may have reached the server:
  only requests that are safe to repeat are sent again (reads, and `create`, whose Idempotency-Key
  makes a repeat answer with the job the first try made);
- a connection that could not be made at all is tried again for every request.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, NoReturn

import httpx

from gluejobs._types import ApiError, Job, Problem, StreamEvent

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT_S = 30.0
# Below the API's keep-alive (GLUEJOBS_KEEP_ALIVE_S, 5 s), so the server never closes a connection
# this client is about to reuse.
CLIENT_KEEPALIVE_S = 2.0
DEFAULT_RETRIES = 4
# A stream reconnects this many times in a row without an event (about a minute of outage at the
# backoff's cap), as a browser's EventSource keeps reconnecting: `watch` should outlive a database
# restart.
STREAM_RETRIES = 10
BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 8.0
RETRY_AFTER_MAX_S = 30.0  # a server asking for longer is waited for this long, then asked again
# The API sends a comment every few seconds on an idle stream: this much silence is a dead connection.
STREAM_IDLE_S = 60.0
# Every answer the client holds in memory (JSON, log text, a submission zip) is refused past this
# size, and a stream's line or event past MAX_STREAM_LINE_BYTES, so that a hostile or broken server
# cannot exhaust the client's memory. Downloads stream to disk and have no cap.
MAX_ANSWER_BYTES = 64 * 1024 * 1024
MAX_STREAM_LINE_BYTES = 4 * 1024 * 1024  # the API's log pieces are 64 KiB, up to 6x that in JSON

RETRY_LATER = frozenset({429, 503})
RETRY_IF_SAFE = frozenset({500, 502, 504})
_NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


# ---------------------------------------------------------------------------------------------------
# Requests and answers
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One API request, as both clients send it."""

    method: str
    path: str
    params: Mapping[str, Any] | None = None
    json: Any = None
    headers: Mapping[str, str] | None = None
    # Safe to send again after a failure that may have reached the server.
    idempotent: bool = True
    timeout: httpx.Timeout | None = None  # None: the client's
    # A file sent as the multipart part `file` (read from disk as it is sent, once per try), with
    # these form fields beside it.
    upload: Path | None = None
    form: Mapping[str, str] | None = None

    @property
    def http(self) -> dict[str, Any]:
        """The keyword arguments of httpx's `request`/`stream`."""
        options: dict[str, Any] = {
            "method": self.method,
            "url": self.path,
            "params": self.params,
            "headers": self.headers,
        }
        if self.json is not None:
            options["json"] = self.json
        if self.timeout is not None:
            options["timeout"] = self.timeout
        return options

    @contextmanager
    def sending(self) -> Iterator[dict[str, Any]]:
        """The keyword arguments of one try; an upload's file is open while it is sent."""
        if self.upload is None:
            yield self.http
            return
        with self.upload.open("rb") as handle:
            yield {**self.http, "files": {"file": (self.upload.name, handle)}, "data": dict(self.form or {})}

    def with_params(self, **params: Any) -> Call:
        return replace(self, params=query(**{**(self.params or {}), **params}))

    def with_headers(self, **headers: str | None) -> Call:
        merged = {**(self.headers or {}), **headers}
        return replace(self, headers={k: v for k, v in merged.items() if v is not None})


def query(**params: Any) -> dict[str, Any]:
    """Query parameters without the ones left out (None)."""
    return {name: value for name, value in params.items() if value is not None}


@dataclass(frozen=True)
class Answer:
    """An HTTP answer read whole (within the size cap)."""

    status_code: int
    headers: httpx.Headers
    content: bytes
    encoding: str
    request: str  # "GET /v1/jobs", for messages

    @classmethod
    def of(cls, response: httpx.Response, content: bytes = b"") -> Answer:
        """`response` with `content` (empty where the body went to a file)."""
        request = response.request
        return cls(
            response.status_code,
            response.headers,
            content,
            response.encoding or "utf-8",
            f"{request.method} {request.url.path}",
        )

    @property
    def ok(self) -> bool:
        return 200 <= self.status_code < 300

    @property
    def text(self) -> str:
        return self.content.decode(self.encoding, errors="replace")

    def json(self) -> Any:
        try:
            return json.loads(self.content)
        except (ValueError, RecursionError) as exc:
            raise ApiError(
                self.status_code, "invalid_answer", f"{self.request} answered with no valid JSON: {exc}"
            ) from None

    def error(self) -> ApiError:
        """The API's error (`{"error": {"code", "message", "field"?, "errors"?}}`), or the status and
        text."""
        try:
            body = json.loads(self.content)["error"]
            omitted = body.get("errors_omitted")
            return ApiError(
                self.status_code,
                str(body["code"]),
                str(body["message"]),
                body.get("field"),
                problems=Problem.parse(body.get("errors")),
                problems_omitted=omitted if isinstance(omitted, int) else 0,
                warnings=Problem.parse(body.get("warnings")),
            )
        except (ValueError, RecursionError, KeyError, TypeError):
            reason = self.text[:500] or httpx.codes.get_reason_phrase(self.status_code)
            return ApiError(self.status_code, "http_error", reason)


class Body:
    """An answer's bytes as they arrive, refused past `limit` (the Content-Length first, when the
    server sends one, so an announced giant is not read at all). httpx hands over decoded bytes,
    so a compressed answer is capped at its unpacked size."""

    def __init__(self, response: httpx.Response, limit: int) -> None:
        self._response = response
        self._limit = limit
        self._chunks: list[bytes] = []
        self._size = 0
        announced = response.headers.get("content-length", "")
        if announced.isdigit() and int(announced) > limit:
            raise self._too_large()

    def add(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size > self._limit:
            raise self._too_large()
        self._chunks.append(chunk)

    def answer(self) -> Answer:
        return Answer.of(self._response, b"".join(self._chunks))

    def _too_large(self) -> ApiError:
        request = self._response.request
        return ApiError(
            0,
            "answer_too_large",
            f"the answer to {request.method} {request.url.path} is over {self._limit} bytes "
            "(max_answer_bytes); refused",
        )


def unreachable(base_url: str, exc: Exception) -> ApiError:
    return ApiError(0, "unreachable", f"cannot reach the API at {base_url}: {exc}")


# ---------------------------------------------------------------------------------------------------
# Retries
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """When a failed request is sent again, and after how long. `retries` counts the tries after the
    first; `connect_retries` (default: `retries`) those of a connection that could not be made at
    all, where nobody is listening; `stream_retries` the reconnections in a row, without an event,
    of a stream that has flowed."""

    retries: int = DEFAULT_RETRIES
    connect_retries: int | None = None
    stream_retries: int = STREAM_RETRIES
    backoff_base_s: float = BACKOFF_BASE_S
    backoff_max_s: float = BACKOFF_MAX_S
    retry_after_max_s: float = RETRY_AFTER_MAX_S

    def delay_s(
        self, call: Call, failures: int, outcome: Answer | Exception, *, streaming: bool = False
    ) -> float | None:
        """Seconds to wait before sending `call` again after its `failures`-th failure in a row
        (`outcome`), or None when it must not be sent again."""
        if failures > self._limit(outcome, streaming) or not may_repeat(call, outcome):
            return None
        backoff = min(self.backoff_max_s, self.backoff_base_s * 2 ** (failures - 1))
        backoff *= 0.5 + random.random() / 2  # jitter: clients that failed together come back apart
        asked = retry_after_s(outcome.headers) if isinstance(outcome, Answer) else None
        return backoff if asked is None else max(min(asked, self.retry_after_max_s), backoff)

    def _limit(self, outcome: Answer | Exception, streaming: bool) -> int:
        if streaming:
            return self.stream_retries
        if isinstance(outcome, _NEVER_SENT) and self.connect_retries is not None:
            return self.connect_retries
        return self.retries


def may_repeat(call: Call, outcome: Answer | Exception) -> bool:
    if isinstance(outcome, Answer):
        if outcome.status_code == 429 and _error_code(outcome) == "over_quota":
            return False  # the owner's quota: waiting a few seconds will not change it
        return outcome.status_code in RETRY_LATER or (
            call.idempotent and outcome.status_code in RETRY_IF_SAFE
        )
    if isinstance(outcome, _NEVER_SENT):
        return True
    return call.idempotent and isinstance(outcome, httpx.TransportError)


def _error_code(answer: Answer) -> str | None:
    try:
        body = json.loads(answer.content)
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    return error.get("code") if isinstance(error, dict) else None


def retry_after_s(headers: Mapping[str, str], now: datetime | None = None) -> float | None:
    """The wait a `Retry-After` header asks for: delay-seconds or an HTTP date (RFC 9110 §10.2.3);
    None when absent or unreadable."""
    value = headers.get("retry-after", "").strip()
    if re.fullmatch(r"\d+(\.\d+)?", value):
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)  # HTTP dates are GMT; an obsolete form may not say so
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


class Retry:
    """One call's tries: after each outcome, how long to wait before the next try (None: it is
    final), and the final outcome as an answer or an ApiError. `failures` counts failures in a row;
    a stream that has flowed sets `streaming`, and sets `failures` back to 0 at each event."""

    def __init__(self, call: Call, policy: RetryPolicy, base_url: str) -> None:
        self.call = call
        self.failures = 0
        self.streaming = False
        self._policy = policy
        self._base_url = base_url

    def delay_s(self, outcome: Answer | Exception) -> float | None:
        if isinstance(outcome, Answer) and outcome.ok:
            return None
        self.failures += 1
        return self._policy.delay_s(self.call, self.failures, outcome, streaming=self.streaming)

    def result(self, outcome: Answer | Exception) -> Answer:
        if isinstance(outcome, Answer) and outcome.ok:
            return outcome
        self.fail(outcome)

    def fail(self, outcome: Answer | Exception) -> NoReturn:
        if isinstance(outcome, Answer):
            error = outcome.error()
            if outcome.status_code in RETRY_LATER and self.failures > 1:
                # Waited for as asked, and still refused: say so, or it reads like a first refusal.
                waited = f"still refused after {self.failures} tries (retries={self._policy.retries})"
                raise ApiError(error.status_code, error.code, f"{error.message}; {waited}", error.field)
            raise error
        if isinstance(outcome, httpx.DecodingError):  # a body its own Content-Encoding cannot undo
            message = f"the answer to {self.call.method} {self.call.path} could not be decoded: {outcome}"
            raise ApiError(0, "invalid_answer", message) from outcome
        raise unreachable(self._base_url, outcome) from outcome


# ---------------------------------------------------------------------------------------------------
# Pages and polling
# ---------------------------------------------------------------------------------------------------


class Pages:
    """Cursor pages (`{data, has_more, next_cursor}`) one after the other: the call for the next
    page, None after the last. A server that repeats a cursor is refused rather than followed forever."""

    def __init__(self, call: Call) -> None:
        self._call = call
        self._after: str | None = None
        self._done = False

    def next(self) -> Call | None:
        return None if self._done else self._call.with_params(after=self._after)

    def rows(self, page: Any) -> list[Any]:
        try:
            data, has_more, cursor = page["data"], page["has_more"], page.get("next_cursor")
        except (KeyError, TypeError):
            raise ApiError(
                0, "invalid_answer", f"{self._call.path} answered no page: {page!r:.200}"
            ) from None
        if has_more and (cursor is None or cursor == self._after):
            raise ApiError(0, "invalid_answer", f"{self._call.path} repeated the cursor {cursor!r}")
        self._done, self._after = not has_more, cursor
        return list(data)


def data_of(body: Any) -> list[Any]:
    """The rows of a `{data: [...]}` answer."""
    if not isinstance(body, Mapping) or not isinstance(body.get("data"), list):
        raise ApiError(0, "invalid_answer", f"expected {{data: [...]}}, got {body!r:.200}")
    return list(body["data"])


class Waiting:
    """`jobs.wait`'s clock: whether a job has finished, TimeoutError once `timeout` has passed."""

    def __init__(self, job_id: int, timeout: float | None) -> None:
        self._job_id = job_id
        self._timeout = timeout
        self._deadline = None if timeout is None else time.monotonic() + timeout

    def over(self, job: Job) -> bool:
        if job.finished:
            return True
        if self._deadline is not None and time.monotonic() >= self._deadline:
            raise TimeoutError(f"job {self._job_id} is still {job.status} after {self._timeout}s")
        return False


# ---------------------------------------------------------------------------------------------------
# Server-Sent Events, and a stream that outlives its connections
# ---------------------------------------------------------------------------------------------------

_LINE_END = re.compile(rb"\r\n|\r|\n")


class SSEParser:
    """Server-Sent Events from a stream's bytes. Written here, in a few dozen lines, so that the
    client depends on httpx alone, and so that a line (or an event's data) is refused past
    `max_bytes`: httpx's `iter_lines` would hold an endless line in memory. It follows the HTML
    standard: lines end with CR, LF or CRLF; fields event, data, id; comments and retry ignored."""

    def __init__(self, max_bytes: int = MAX_STREAM_LINE_BYTES) -> None:
        self._max_bytes = max_bytes
        self._partial: list[bytes] = []  # the line being received
        self._partial_bytes = 0
        self._after_cr = False  # the last chunk ended with CR: a LF opening the next one ends nothing
        self._event = "message"
        self._data: list[str] = []
        self._data_bytes = 0
        self._id: str | None = None

    def feed(self, chunk: bytes) -> list[StreamEvent]:
        if self._after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        self._after_cr = chunk.endswith(b"\r")
        *ended, rest = _LINE_END.split(chunk)
        events = []
        for piece in ended:
            line = b"".join([*self._partial, piece])
            self._partial, self._partial_bytes = [], 0
            self._check(len(line), "a line")
            event = self._line(line.decode("utf-8", errors="replace"))
            if event is not None:
                events.append(event)
        self._partial.append(rest)
        self._partial_bytes += len(rest)
        self._check(self._partial_bytes, "a line")
        return events

    def _line(self, line: str) -> StreamEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
            self._data_bytes += len(value)
            self._check(self._data_bytes, "an event's data")
        elif name == "id" and "\0" not in value:
            self._id = value
        return None

    def _dispatch(self) -> StreamEvent | None:
        event = None
        if self._data:
            event = StreamEvent(self._event, json_or_text("\n".join(self._data)), self._id)
        self._event, self._data, self._data_bytes = "message", [], 0
        return event

    def _check(self, size: int, what: str) -> None:
        if size > self._max_bytes:
            raise ApiError(
                0, "answer_too_large", f"the stream sent {what} over {self._max_bytes} bytes; refused"
            )


def json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


class StreamResume:
    """The bookkeeping of a stream that outlives its connections, with no I/O: the request for the
    next connection (with `Last-Event-ID` once an event has come), the events of each chunk, and
    after a lost connection or an error answer how long to wait before connecting again, or the
    error to raise. Events go out as they are parsed and the cursor moves with them; an event cut
    off by a dropped connection is never handed out, and the server sends it again after the
    cursor: nothing is lost and nothing repeated."""

    CLOSED = "the stream closed before the job ended"

    def __init__(self, retry: Retry, last_event_id: str | None, max_line_bytes: int) -> None:
        self.last_event_id = last_event_id
        self.ended = False
        self._retry = retry
        self._max_line_bytes = max_line_bytes
        self._parser = SSEParser(max_line_bytes)

    def connect(self) -> Call:
        self._parser = SSEParser(self._max_line_bytes)  # a half-received event is sent again
        return self._retry.call.with_headers(**{"Last-Event-ID": self.last_event_id})

    def feed(self, chunk: bytes) -> list[StreamEvent]:
        # Once the stream has flowed it reconnects as patiently as the policy's stream_retries say;
        # a stream that never started fails like any request (the CLI's `watch` of an API that is
        # not running says so at once).
        self._retry.streaming = True
        events = []
        for event in self._parser.feed(chunk):
            events.append(event)
            self._retry.failures = 0
            self.last_event_id = event.id or self.last_event_id
            if event.event == "end":
                self.ended = True
                break
        return events

    def lost(self, outcome: Answer | Exception | None) -> float:
        """The connection ended before the job did: `outcome` is the error answer, the exception
        that broke it, or None when the server closed it early. Returns the wait; raises when the
        stream must not reconnect (an answer such as 404, or too many failures in a row)."""
        outcome = outcome or httpx.RemoteProtocolError(self.CLOSED)
        delay = self._retry.delay_s(outcome)
        if delay is None:
            self._retry.fail(outcome)
        return delay
