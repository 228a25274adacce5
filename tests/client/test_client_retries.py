"""The client's retry rules, through httpx.MockTransport for both clients: 429 and 503 wait as long as
`Retry-After` asks (seconds or an HTTP date, capped) and back off further on repeats; a retried
create keeps its Idempotency-Key; a request that may have been acted on is not sent twice; a stream
resumes after a dropped connection or an outage with `Last-Event-ID`, losing and repeating nothing.
The last test replays an outage over real sockets, through the CLI too."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from gluejobs import ApiError, AsyncClient, Client, StreamEvent
from gluejobs._core import Answer, Call, RetryPolicy, SSEParser, retry_after_s
from tests.support.scripted_server import Exchange, scripted_server, sse

REPO = Path(__file__).resolve().parents[2]
QUICK = RetryPolicy(retries=4, backoff_base_s=0.01)
JOB = {"id": 7, "status": "queued", "spec": {"task_name": "sst2"}}
OUTAGE = {"error": {"code": "database_unavailable", "message": "the database is unreachable"}}
Handler = Callable[[httpx.Request], httpx.Response]


class Recording:
    """A MockTransport that answers from a list, one answer (or exception) per request, and keeps
    each request and the time it came."""

    def __init__(self, *answers: httpx.Response | Exception | Callable[[], httpx.Response]) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []
        self.times: list[float] = []
        self.transport = httpx.MockTransport(self._handle)

    def _handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.times.append(time.monotonic())
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer() if callable(answer) else answer

    def gaps(self) -> list[float]:
        return [later - earlier for earlier, later in zip(self.times, self.times[1:], strict=False)]


def outage(retry_after: str | None = "0") -> httpx.Response:
    return httpx.Response(503, json=OUTAGE, headers={"Retry-After": retry_after} if retry_after else {})


def lost() -> httpx.ReadError:
    return httpx.ReadError("connection reset after the request was sent")


def call(mode: str, recording: Recording, action: Callable[[Any], Any], **options: Any) -> Any:
    """`action(client)` on a sync or an async client over the recording transport."""
    if mode == "sync":
        with Client("http://api.test", transport=recording.transport, **options) as client:
            result = action(client)
            return list(result) if isinstance(result, Iterator) else result

    async def run() -> Any:
        async with AsyncClient("http://api.test", transport=recording.transport, **options) as client:
            result = action(client)
            if isinstance(result, AsyncIterator):
                return [item async for item in result]
            return await result

    return asyncio.run(run())


MODES = ("sync", "async")


@pytest.mark.parametrize("mode", MODES)
def test_429_waits_as_long_as_retry_after_asks(mode: str) -> None:
    def in_two_seconds() -> httpx.Response:
        when = format_datetime(datetime.now(UTC) + timedelta(seconds=2), usegmt=True)
        return httpx.Response(429, headers={"Retry-After": when})

    recording = Recording(
        httpx.Response(
            429,
            json={"error": {"code": "rate_limited", "message": "slow down"}},
            headers={"Retry-After": "1"},
        ),
        in_two_seconds,
        httpx.Response(200, json=JOB),
    )
    job = call(mode, recording, lambda c: c.jobs.get(7), retries=QUICK)
    assert job.id == 7 and len(recording.requests) == 3
    first, second = recording.gaps()
    assert first >= 1.0  # seconds; the backoff alone would be ~0.01 s
    assert second >= 0.9  # an HTTP date two seconds ahead (one-second resolution)


@pytest.mark.parametrize("mode", MODES)
def test_503_with_retry_after_is_retried_with_a_growing_backoff(mode: str) -> None:
    policy = RetryPolicy(retries=4, backoff_base_s=0.1)
    recording = Recording(outage("1"), outage("0"), outage("0"), outage("0"), httpx.Response(200, json=JOB))
    assert call(mode, recording, lambda c: c.jobs.get(7), retries=policy).id == 7
    gaps = recording.gaps()
    assert gaps[0] >= 1.0  # what the server asked for
    # Then the client's own backoff: 0.1 s, 0.2 s, 0.4 s (each with up to half taken off as jitter).
    assert [g >= low for g, low in zip(gaps[1:], (0.05, 0.1, 0.2), strict=True)] == [True] * 3
    assert gaps[3] > gaps[1]

    # Past its retries the outage is the caller's, with the API's own code.
    recording = Recording(outage(), outage(), outage())
    with pytest.raises(ApiError) as caught:
        call(mode, recording, lambda c: c.jobs.get(7), retries=RetryPolicy(retries=2, backoff_base_s=0.01))
    assert (caught.value.status_code, caught.value.code) == (503, "database_unavailable")
    assert len(recording.requests) == 3


@pytest.mark.parametrize("mode", MODES)
def test_a_retried_create_sends_the_same_idempotency_key(mode: str) -> None:
    recording = Recording(lost(), outage(), httpx.Response(201, json=JOB))
    job = call(mode, recording, lambda c: c.jobs.create({"task_name": "sst2"}, priority=2), retries=QUICK)
    assert job.id == 7
    assert len(recording.requests) == 3
    assert len({r.headers["Idempotency-Key"] for r in recording.requests}) == 1
    assert {r.content for r in recording.requests} == {recording.requests[0].content}
    assert json.loads(recording.requests[0].content)["priority"] == 2
    # Two calls are two jobs: each has its own key.
    recording = Recording(httpx.Response(201, json=JOB), httpx.Response(201, json=JOB))
    call(mode, recording, lambda c: c.jobs.create({"task_name": "sst2"}))
    call(mode, recording, lambda c: c.jobs.create({"task_name": "sst2"}))
    assert len({r.headers["Idempotency-Key"] for r in recording.requests}) == 2


@pytest.mark.parametrize("mode", MODES)
def test_a_request_the_server_may_have_acted_on_is_not_sent_again(mode: str) -> None:
    server_error = httpx.Response(500, json={"error": {"code": "internal_error", "message": "boom"}})
    bad_gateway = httpx.Response(502, text="bad gateway")
    for answer, code in (
        (server_error, "internal_error"),
        (lost(), "unreachable"),
        (bad_gateway, "http_error"),
    ):
        recording = Recording(answer, httpx.Response(200, json=JOB))
        with pytest.raises(ApiError) as caught:
            call(mode, recording, lambda c: c.jobs.cancel(7), retries=QUICK)
        assert caught.value.code == code and len(recording.requests) == 1
        recording = Recording(answer, httpx.Response(200, json={}))
        with pytest.raises(ApiError):
            call(mode, recording, lambda c: c.request("POST", "/v1/sweeps", json={}), retries=QUICK)
        assert len(recording.requests) == 1

    # What never reached the server, or was refused for later (429, 503), is sent again even so.
    for first in (httpx.ConnectError("connection refused"), outage()):
        recording = Recording(first, httpx.Response(200, json={**JOB, "status": "cancelled"}))
        assert call(mode, recording, lambda c: c.jobs.cancel(7), retries=QUICK).status == "cancelled"
        assert len(recording.requests) == 2


@pytest.mark.parametrize("mode", MODES)
def test_reads_are_sent_again_after_a_lost_connection_or_a_5xx(mode: str) -> None:
    recording = Recording(lost(), httpx.Response(502, text="bad gateway"), httpx.Response(200, json=JOB))
    assert call(mode, recording, lambda c: c.jobs.get(7), retries=QUICK).id == 7
    assert len(recording.requests) == 3
    # A 4xx is final at once.
    recording = Recording(httpx.Response(404, json={"error": {"code": "not_found", "message": "no job 7"}}))
    with pytest.raises(ApiError) as caught:
        call(mode, recording, lambda c: c.jobs.get(7), retries=QUICK)
    assert (caught.value.status_code, caught.value.code, len(recording.requests)) == (404, "not_found", 1)


class Cut(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A response body that sends `chunks`, then breaks as a dropped connection does."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        yield from self.chunks
        raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")


def metric(row: int) -> bytes:
    data = {"id": row, "epoch": 0.0, "step": row, "split": "train", "name": "loss", "value": 1 / row}
    data["created_at"] = "2025-01-02T03:04:05+00:00"
    return sse("metric", data, f"{row}.0")


def event_stream(*chunks: bytes) -> httpx.Response:
    return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, stream=Cut(*chunks))


@pytest.mark.parametrize("mode", MODES)
def test_a_stream_resumes_with_last_event_id_after_a_drop_and_an_outage(mode: str) -> None:
    third = metric(3)
    end = sse("end", {"status": "succeeded"}, "4.0")
    recording = Recording(
        event_stream(b": job 7\n\n", metric(1), metric(2)[:10], metric(2)[10:], third[:25]),  # cut mid-event
        outage("0"),  # the API is up, its database is not
        httpx.ConnectError("connection refused"),  # the API restarts
        httpx.Response(200, headers={"Content-Type": "text/event-stream"}, content=third + metric(4) + end),
    )
    events = call(mode, recording, lambda c: c.jobs.stream(7), retries=QUICK)
    assert [(e.event, e.id) for e in events] == [
        ("metric", "1.0"),
        ("metric", "2.0"),
        ("metric", "3.0"),
        ("metric", "4.0"),
        ("end", "4.0"),
    ]
    assert [e.data["step"] for e in events if e.event == "metric"] == [1, 2, 3, 4]
    assert [r.headers.get("Last-Event-ID") for r in recording.requests] == [None, "2.0", "2.0", "2.0"]


@pytest.mark.parametrize("mode", MODES)
def test_a_stream_gives_up_on_a_final_answer_or_an_outage_that_lasts(mode: str) -> None:
    def drain(client: Any) -> Any:
        return client.jobs.stream(7)

    missing = httpx.Response(404, json={"error": {"code": "not_found", "message": "job 7 not found"}})
    recording = Recording(missing)
    with pytest.raises(ApiError) as caught:
        call(mode, recording, drain, retries=QUICK)
    assert caught.value.code == "not_found" and len(recording.requests) == 1

    # A stream that has flowed reconnects `stream_retries` times in a row; one that never started
    # fails like any request, after `retries`.
    policy = RetryPolicy(retries=1, stream_retries=3, backoff_base_s=0.01)
    recording = Recording(event_stream(b": job 7\n\n", metric(1)), *[outage() for _ in range(3)])
    with pytest.raises(ApiError) as caught:
        call(mode, recording, drain, retries=policy)
    assert caught.value.code == "database_unavailable" and len(recording.requests) == 1 + 3
    recording = Recording(*[outage() for _ in range(4)])
    with pytest.raises(ApiError) as caught:
        call(mode, recording, drain, retries=policy)
    assert caught.value.code == "database_unavailable" and len(recording.requests) == 2


@pytest.mark.parametrize("mode", MODES)
def test_a_server_that_repeats_its_cursor_is_not_followed_forever(mode: str) -> None:
    page = {"data": [JOB], "has_more": True, "next_cursor": "abc"}
    recording = Recording(httpx.Response(200, json=page), httpx.Response(200, json=page))
    with pytest.raises(ApiError, match="repeated the cursor 'abc'"):
        call(mode, recording, lambda c: c.jobs.list())
    assert [r.url.params.get("after") for r in recording.requests] == [None, "abc"]


@pytest.mark.parametrize("mode", MODES)
def test_an_answer_that_cannot_be_read_is_a_clear_error_not_a_traceback(mode: str) -> None:
    garbled = httpx.Response(200, headers={"Content-Encoding": "gzip"}, stream=httpx.ByteStream(b"not gzip"))
    not_json = httpx.Response(200, text="<html>a captive portal</html>")
    bad_time = httpx.Response(200, json={**JOB, "created_at": "yesterday"})
    for answer, says in (
        (garbled, "could not be decoded"),
        (not_json, "no valid JSON"),
        (bad_time, "Job.created_at is not a timestamp: 'yesterday'"),
    ):
        recording = Recording(answer)
        with pytest.raises(ApiError) as caught:
            call(mode, recording, lambda c: c.jobs.get(7), retries=QUICK)
        assert caught.value.code == "invalid_answer" and says in str(caught.value)
        assert len(recording.requests) == 1


# ---------------------------------------------------------------------------------------------------
# The I/O-free parts
# ---------------------------------------------------------------------------------------------------


def test_retry_after_reads_seconds_and_http_dates_and_is_capped() -> None:
    now = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert retry_after_s({"retry-after": "7"}, now) == 7.0
    assert retry_after_s({"retry-after": "Thu, 02 Jan 2025 03:04:35 GMT"}, now) == 30.0
    assert retry_after_s({"retry-after": "Thu, 02 Jan 2025 03:00:00 GMT"}, now) == 0.0  # already past
    assert retry_after_s({"retry-after": "soon"}, now) is None
    assert retry_after_s({}, now) is None
    # A server asking for an hour is waited for the cap, then asked again.
    answer = Answer(503, httpx.Headers({"Retry-After": "3600"}), b"", "utf-8", "GET /v1/jobs")
    policy = RetryPolicy(retry_after_max_s=30.0)
    assert policy.delay_s(Call("GET", "/v1/jobs"), 1, answer) == 30.0
    assert policy.delay_s(Call("GET", "/v1/jobs"), 5, answer) is None  # past its retries


def test_the_event_parser_follows_the_standard_across_chunk_boundaries() -> None:
    parser = SSEParser(max_bytes=100)
    text = (
        b': comment\r\nid: 1.0\r\nevent: metric\r\ndata: {"a":\r\ndata: 1}\r\n\r\n'
        b"event: x\n\nid: 2.0\rdata: plain\r\r"
    )
    chunks = [text[i : i + 3] for i in range(0, len(text), 3)]  # CR and LF land in different chunks
    events = [event for chunk in chunks for event in parser.feed(chunk)]
    assert events == [StreamEvent("metric", {"a": 1}, "1.0"), StreamEvent("message", "plain", "2.0")]
    with pytest.raises(ApiError, match="answer_too_large"):
        parser.feed(b"data: " + b"x" * 101)


def test_the_stream_of_real_sockets_survives_an_outage_through_the_cli_too() -> None:
    """The same outage, over real sockets: a stream cut mid-event, then two 503s (Retry-After in
    seconds, then as an HTTP date), then the API back; each metric row arrives once, in order."""
    for runner in ("sync", "async", "cli"):
        api = OutageApi()
        started = time.monotonic()
        with scripted_server(api) as (url, _):
            steps = follow(runner, url)
        assert steps == [1, 2, 3, 4], runner
        assert api.last_event_ids == [None, "2.0", "2.0", "2.0"], runner
        assert time.monotonic() - started >= 1.0  # the outage was waited out, as asked


class OutageApi:
    def __init__(self) -> None:
        self.last_event_ids: list[str | None] = []
        self.lock = threading.Lock()

    def __call__(self, exchange: Exchange) -> None:
        with self.lock:
            number = len(self.last_event_ids)
            self.last_event_ids.append(exchange.headers.get("Last-Event-ID"))
        if number == 0:
            pieces = [b": job 7\n\n", metric(1), metric(2), metric(3)[:30]]
            exchange.chunked(pieces, "text/event-stream", complete=False)
        elif number == 1:
            exchange.json(OUTAGE, status=503, **{"Retry-After": "1"})
        elif number == 2:
            soon = format_datetime(datetime.now(UTC) + timedelta(seconds=1), usegmt=True)
            exchange.json(OUTAGE, status=503, **{"Retry-After": soon})
        else:
            exchange.chunked(
                [metric(3), metric(4), sse("end", {"status": "succeeded"}, "4.0")], "text/event-stream"
            )


def follow(runner: str, url: str) -> list[int]:
    if runner == "sync":
        with Client(url) as client:
            return [row.step for row in client.jobs.metrics(7, follow=True)]
    if runner == "async":

        async def rows() -> list[int]:
            async with AsyncClient(url) as client:
                return [row.step async for row in client.jobs.metrics(7, follow=True)]

        return asyncio.run(rows())
    result = subprocess.run(
        [sys.executable, "-m", "gluejobs.cli", "metrics", "7", "--follow", "--csv", "--url", url],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    return [int(line.split(",")[2]) for line in result.stdout.splitlines()[1:]]
