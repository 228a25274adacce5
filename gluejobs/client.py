"""The gluejobs Python client, sync and async, over httpx (and nothing else but the standard library).

    from gluejobs import Client

    with Client("http://127.0.0.1:8000", api_key="…") as client:
        job = client.jobs.create({"model_name_or_path": "bert-base-cased", "task_name": "mrpc"})
        for row in client.jobs.metrics(job.id, follow=True):
            print(row.step, row.split, row.name, row.value)
        client.jobs.download(job.id, "model/")

`AsyncClient` has the same methods, awaited (and `async for` over the iterators). Every error is
an `ApiError` carrying the API's error code, message and field. Requests are retried with
exponential backoff on connection errors, 5xx and 429 when repeating them is safe: reads, and
`create`, which sends an Idempotency-Key it generates so a retried create never makes two jobs.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import os
import random
import tarfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx

DEFAULT_URL = "http://127.0.0.1:8000"
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_RETRIES = 4
BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 8.0
WAIT_POLL_S = 2.0
PAGE_ROWS = 1000
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
DOWNLOAD_KINDS = ("model", "predictions")  # what `download` fetches without a checkpoint or path


# ---------------------------------------------------------------------------------------------------
# Errors and results
# ---------------------------------------------------------------------------------------------------


class ApiError(Exception):
    """An error answer of the API (`{"error": {"code", "message", "field"?}}`), or no answer at all
    (status_code 0, code "unreachable")."""

    def __init__(self, status_code: int, code: str, message: str, field: str | None = None) -> None:
        self.status_code = status_code
        self.code = code
        self.message = message
        self.field = field
        where = f" ({field})" if field else ""
        super().__init__(f"{status_code} {code}{where}: {message}" if status_code else f"{code}: {message}")


T = TypeVar("T", bound="_Result")


@dataclass(frozen=True)
class _Result:
    """A result built from an API answer: the documented fields typed, everything in `raw`, so
    fields a newer API adds are never lost."""

    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls: type[T], body: Mapping[str, Any]) -> T:
        values: dict[str, Any] = {"raw": dict(body)}
        for item in fields(cls):
            if item.name == "raw" or item.name not in body:
                continue
            value = body[item.name]
            if isinstance(value, str) and item.name.endswith(("_at", "modified")):
                value = datetime.fromisoformat(value)
            values[item.name] = value
        return cls(**values)


@dataclass(frozen=True)
class Job(_Result):
    id: int = 0
    status: str = ""
    spec: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)
    attempts: int = 0
    max_attempts: int = 0
    worker_id: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    cancel_requested_at: datetime | None = None
    error: str | None = None
    error_code: str | None = None
    output_dir: str | None = None
    latest_metrics: dict[str, Any] = field(default_factory=dict)
    best_metrics: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    headline_metric: dict[str, Any] | None = None

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL_STATUSES


@dataclass(frozen=True)
class Metric(_Result):
    id: int = 0
    epoch: float = 0.0
    step: int = 0
    split: str = ""
    name: str = ""
    value: float = 0.0
    created_at: datetime | None = None


@dataclass(frozen=True)
class Event(_Result):
    id: int = 0
    created_at: datetime | None = None
    kind: str = ""
    level: str = ""
    message: str = ""
    data: dict[str, Any] | None = None


@dataclass(frozen=True)
class Checkpoint(_Result):
    epoch: float = 0.0
    step: int = 0
    path: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    created_at: datetime | None = None
    is_best: bool = False


@dataclass(frozen=True)
class Artifact(_Result):
    path: str = ""
    size: int = 0
    modified: datetime | None = None
    kind: str = ""


@dataclass(frozen=True)
class WorkerInfo(_Result):
    id: str = ""
    host: str = ""
    pid: int = 0
    version: str | None = None
    devices: list[str] = field(default_factory=list)
    state: str = ""  # idle, busy, draining, stopped, or gone (no heartbeat for a lease)
    started_at: datetime | None = None
    last_heartbeat_at: datetime | None = None
    stopped_at: datetime | None = None
    jobs: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class StreamEvent:
    """One Server-Sent Event of /v1/jobs/{id}/stream: `event` is metric, checkpoint, status, event,
    log or end; `data` its decoded JSON; `id` the cursor to resume after it."""

    event: str
    data: Any
    id: str | None


# ---------------------------------------------------------------------------------------------------
# What both clients share: requests, retries, answers
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Call:
    method: str
    path: str
    params: dict[str, Any] | None = None
    json: Any = None
    headers: dict[str, str] | None = None
    # Safe to send again after a failure that may have reached the server.
    retry: bool = True


def _headers(api_key: str | None) -> dict[str, str]:
    headers = {"User-Agent": "gluejobs-client"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def _error(response: httpx.Response) -> ApiError:
    try:
        body = response.json()["error"]
        return ApiError(response.status_code, str(body["code"]), str(body["message"]), body.get("field"))
    except (ValueError, KeyError, TypeError):
        return ApiError(response.status_code, "http_error", response.text[:500] or response.reason_phrase)


def _should_retry(call: _Call, outcome: httpx.Response | Exception) -> bool:
    if isinstance(outcome, httpx.Response):
        return outcome.status_code == 429 or (call.retry and outcome.status_code in RETRY_STATUSES)
    if isinstance(outcome, (httpx.ConnectError, httpx.ConnectTimeout)):
        return True  # the request never reached the server
    return call.retry and isinstance(outcome, httpx.TransportError)


def _delay_s(attempt: int, outcome: httpx.Response | Exception) -> float:
    if isinstance(outcome, httpx.Response):
        after = outcome.headers.get("Retry-After", "")
        if after.isdigit():
            return min(float(after), BACKOFF_MAX_S)
    return min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2**attempt) * (0.5 + random.random() / 2)


def _unreachable(base_url: str, exc: Exception) -> ApiError:
    return ApiError(0, "unreachable", f"cannot reach the API at {base_url}: {exc}")


def _page_params(after: str | None, limit: int, **extra: Any) -> dict[str, Any]:
    params = {k: v for k, v in extra.items() if v is not None}
    params["limit"] = limit
    if after is not None:
        params["after"] = after
    return params


def _create_call(
    spec: Mapping[str, Any],
    priority: int,
    metadata: Mapping[str, str] | None,
    max_attempts: int,
    idempotency_key: str | None,
) -> _Call:
    body = {
        "spec": dict(spec),
        "priority": priority,
        "metadata": dict(metadata or {}),
        "max_attempts": max_attempts,
    }
    # One key for every try of this call: the API answers a repeat with the job the first try made.
    key = idempotency_key or str(uuid.uuid4())
    return _Call("POST", "/v1/jobs", json=body, headers={"Idempotency-Key": key})


class _SSEParser:
    """Server-Sent Events from lines of text. Written here, in a dozen lines, so that the client
    depends on httpx alone; it follows the HTML standard's field rules (event, data, id; comments
    and retry ignored)."""

    def __init__(self) -> None:
        self.event = "message"
        self.data: list[str] = []
        self.id: str | None = None

    def feed(self, line: str) -> StreamEvent | None:
        if not line:
            if not self.data:
                self.event = "message"
                return None
            event = StreamEvent(self.event, _json_or_text("\n".join(self.data)), self.id)
            self.event, self.data = "message", []
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self.event = value
        elif name == "data":
            self.data.append(value)
        elif name == "id" and "\0" not in value:
            self.id = value
        return None


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _metric_matches(row: Metric, split: str | None, name: str | None) -> bool:
    return (split is None or row.split == split) and (name is None or row.name == name)


_DOWNLOAD_TIMEOUT = httpx.Timeout(DEFAULT_TIMEOUT_S, read=300.0)


def _download_paths(checkpoint: int | None, path: str | None) -> builtins.list[str]:
    if checkpoint is not None:
        return [f"checkpoints/checkpoint-{checkpoint}"]
    return [path] if path is not None else []


def _is_tar(response: httpx.Response) -> bool:
    return response.headers.get("content-type", "").startswith("application/x-tar")


def _partial_path(dest: Path, path: str, is_tar: bool) -> Path:
    out = dest / (Path(path).name + ".tar" if is_tar else path)
    out.parent.mkdir(parents=True, exist_ok=True)
    return out.with_name(out.name + ".partial")


def _finish_download(partial: Path, dest: Path, path: str, is_tar: bool) -> None:
    """A file is renamed into place once whole; a folder's tar is unpacked into dest (PEP 706's
    "data" filter refuses absolute paths, links that lead out and device files)."""
    if not is_tar:
        partial.replace(dest / path)
        return
    try:
        with tarfile.open(partial) as archive:
            archive.extractall(dest, filter="data")
    finally:
        partial.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------------
# The synchronous client
# ---------------------------------------------------------------------------------------------------


class Client:
    """A synchronous client of the gluejobs API. `base_url` and `api_key` default to the
    GLUEJOBS_URL and GLUEJOBS_API_KEY environment variables."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        retries: int = DEFAULT_RETRIES,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = (base_url or os.environ.get("GLUEJOBS_URL") or DEFAULT_URL).rstrip("/")
        api_key = api_key if api_key is not None else os.environ.get("GLUEJOBS_API_KEY")
        self.retries = retries
        self._http = httpx.Client(
            base_url=self.base_url, headers=_headers(api_key), timeout=timeout, transport=transport
        )
        self.jobs = Jobs(self)
        self.workers = Workers(self)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, call: _Call) -> httpx.Response:
        for attempt in range(self.retries + 1):
            try:
                outcome: httpx.Response | Exception = self._http.request(
                    call.method, call.path, params=call.params, json=call.json, headers=call.headers
                )
            except httpx.TransportError as exc:
                outcome = exc
            if attempt < self.retries and _should_retry(call, outcome):
                time.sleep(_delay_s(attempt, outcome))
                continue
            if isinstance(outcome, Exception):
                raise _unreachable(self.base_url, outcome) from outcome
            if not outcome.is_success:
                raise _error(outcome)
            return outcome
        raise AssertionError("unreachable")  # the loop always returns or raises

    def _json(self, call: _Call) -> Any:
        return self._send(call).json()

    def request(
        self, method: str, path: str, *, params: Mapping[str, Any] | None = None, json: Any = None
    ) -> Any:
        """Any other endpoint (sweeps, the leaderboard …): its decoded JSON, with the same errors;
        retried like the rest only when `method` is GET."""
        call = _Call(method.upper(), path, dict(params or {}), json, retry=method.upper() == "GET")
        return self._json(call)

    def fetch(self, path: str, *, params: Mapping[str, Any] | None = None) -> bytes:
        """A GET endpoint's raw bytes (GLUE's submission zip …), retried, with the same errors."""
        return self._send(_Call("GET", path, dict(params or {}))).content


class Jobs:
    def __init__(self, client: Client) -> None:
        self._client = client

    def create(
        self,
        spec: Mapping[str, Any],
        *,
        priority: int = 0,
        metadata: Mapping[str, str] | None = None,
        max_attempts: int = 3,
        idempotency_key: str | None = None,
    ) -> Job:
        """Queue a job; retried safely under one Idempotency-Key (generated unless given)."""
        call = _create_call(spec, priority, metadata, max_attempts, idempotency_key)
        return Job.from_json(self._client._json(call))

    def get(self, job_id: int) -> Job:
        return Job.from_json(self._client._json(_Call("GET", f"/v1/jobs/{job_id}")))

    def list(self, *, status: str | builtins.list[str] | None = None, page_size: int = 100) -> Iterator[Job]:
        """Every job (newest first) with that status, page after page."""
        statuses = ",".join([status] if isinstance(status, str) else status) if status else None
        after = None
        while True:
            page = self._client._json(
                _Call("GET", "/v1/jobs", params=_page_params(after, page_size, status=statuses))
            )
            yield from (Job.from_json(item) for item in page["data"])
            if not page["has_more"]:
                return
            after = page["next_cursor"]

    def cancel(self, job_id: int) -> Job:
        # Not repeated after a failure that may have reached the server: a second cancel of a job
        # the first one cancelled answers 409.
        return Job.from_json(self._client._json(_Call("POST", f"/v1/jobs/{job_id}/cancel", retry=False)))

    def wait(self, job_id: int, *, timeout: float | None = None, poll_interval: float = WAIT_POLL_S) -> Job:
        """The job once it has finished; TimeoutError after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.get(job_id)
            if job.finished:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} is still {job.status} after {timeout}s")
            time.sleep(poll_interval)

    def metrics(
        self, job_id: int, *, follow: bool = False, split: str | None = None, name: str | None = None
    ) -> Iterator[Metric]:
        """The job's metric rows in order; with `follow`, new rows as they come until the job ends."""
        if follow:
            for message in self.stream(job_id):
                if message.event == "metric":
                    row = Metric.from_json(message.data)
                    if _metric_matches(row, split, name):
                        yield row
            return
        yield from (
            Metric.from_json(r) for r in self._rows(f"/v1/jobs/{job_id}/metrics", split=split, name=name)
        )

    def events(self, job_id: int) -> Iterator[Event]:
        yield from (Event.from_json(r) for r in self._rows(f"/v1/jobs/{job_id}/events"))

    def checkpoints(self, job_id: int) -> builtins.list[Checkpoint]:
        body = self._client._json(_Call("GET", f"/v1/jobs/{job_id}/checkpoints"))
        return [Checkpoint.from_json(item) for item in body["data"]]

    def logs(self, job_id: int, *, attempt: int | None = None, tail: int | None = None) -> str:
        params = {k: v for k, v in (("attempt", attempt), ("tail", tail)) if v is not None}
        return self._client._send(_Call("GET", f"/v1/jobs/{job_id}/logs", params=params)).text

    def follow_logs(self, job_id: int, *, attempt: int | None = None) -> Iterator[str]:
        """The job's log text from the start, then as it is written, until the job ends."""
        for message in self.stream(job_id, logs=True):
            if message.event == "log" and (attempt is None or message.data["attempt"] == attempt):
                yield str(message.data["text"])

    def artifacts(self, job_id: int) -> builtins.list[Artifact]:
        body = self._client._json(_Call("GET", f"/v1/jobs/{job_id}/artifacts"))
        return [Artifact.from_json(item) for item in body["data"]]

    def download(
        self,
        job_id: int,
        dest: str | os.PathLike[str],
        *,
        checkpoint: int | None = None,
        path: str | None = None,
    ) -> Path:
        """Download into `dest`: the final model (and predictions) by default, a checkpoint's folder
        with `checkpoint=STEP`, or one file or folder with `path=`. Returns `dest`."""
        target = Path(dest)
        target.mkdir(parents=True, exist_ok=True)
        paths = _download_paths(checkpoint, path) or [
            a.path for a in self.artifacts(job_id) if a.kind in DOWNLOAD_KINDS
        ]
        if not paths:
            raise ApiError(404, "not_found", f"job {job_id} has no model files yet")
        for item in paths:
            url = f"/v1/jobs/{job_id}/artifacts/{item}"
            with self._client._http.stream("GET", url, timeout=_DOWNLOAD_TIMEOUT) as response:
                if not response.is_success:
                    response.read()
                    raise _error(response)
                is_tar = _is_tar(response)
                partial = _partial_path(target, item, is_tar)
                with partial.open("wb") as handle:
                    for chunk in response.iter_bytes():
                        handle.write(chunk)
            _finish_download(partial, target, item, is_tar)
        return target

    def stream(
        self, job_id: int, *, logs: bool = False, last_event_id: str | None = None
    ) -> Iterator[StreamEvent]:
        """The job's live stream (metric, checkpoint, status, event, log, end) until the job ends,
        reconnecting after a dropped connection where it left off (Last-Event-ID)."""
        failures = 0
        while True:
            headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
            try:
                with self._client._http.stream(
                    "GET",
                    f"/v1/jobs/{job_id}/stream",
                    params={"logs": "true"} if logs else None,
                    headers=headers,
                    timeout=httpx.Timeout(DEFAULT_TIMEOUT_S, read=None),
                ) as response:
                    if not response.is_success:
                        response.read()
                        raise _error(response)
                    parser = _SSEParser()
                    for line in response.iter_lines():
                        message = parser.feed(line)
                        if message is None:
                            continue
                        failures = 0
                        last_event_id = message.id or last_event_id
                        yield message
                        if message.event == "end":
                            return
                error: Exception = httpx.RemoteProtocolError("the stream closed before the job ended")
            except httpx.TransportError as exc:
                error = exc
            failures += 1
            if failures > self._client.retries:
                raise _unreachable(self._client.base_url, error) from error
            time.sleep(_delay_s(failures, error))

    def _rows(self, path: str, **filters: Any) -> Iterator[dict[str, Any]]:
        after = None
        while True:
            page = self._client._json(_Call("GET", path, params=_page_params(after, PAGE_ROWS, **filters)))
            yield from page["data"]
            if not page["has_more"]:
                return
            after = page["next_cursor"]


class Workers:
    def __init__(self, client: Client) -> None:
        self._client = client

    def list(self) -> builtins.list[WorkerInfo]:
        body = self._client._json(_Call("GET", "/v1/workers"))
        return [WorkerInfo.from_json(item) for item in body["data"]]


# ---------------------------------------------------------------------------------------------------
# The asynchronous client: the same methods, awaited
# ---------------------------------------------------------------------------------------------------


class AsyncClient:
    """An asyncio client of the gluejobs API; see Client."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        retries: int = DEFAULT_RETRIES,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = (base_url or os.environ.get("GLUEJOBS_URL") or DEFAULT_URL).rstrip("/")
        api_key = api_key if api_key is not None else os.environ.get("GLUEJOBS_API_KEY")
        self.retries = retries
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=_headers(api_key), timeout=timeout, transport=transport
        )
        self.jobs = AsyncJobs(self)
        self.workers = AsyncWorkers(self)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: _Call) -> httpx.Response:
        for attempt in range(self.retries + 1):
            try:
                outcome: httpx.Response | Exception = await self._http.request(
                    call.method, call.path, params=call.params, json=call.json, headers=call.headers
                )
            except httpx.TransportError as exc:
                outcome = exc
            if attempt < self.retries and _should_retry(call, outcome):
                await asyncio.sleep(_delay_s(attempt, outcome))
                continue
            if isinstance(outcome, Exception):
                raise _unreachable(self.base_url, outcome) from outcome
            if not outcome.is_success:
                raise _error(outcome)
            return outcome
        raise AssertionError("unreachable")

    async def _json(self, call: _Call) -> Any:
        return (await self._send(call)).json()

    async def request(
        self, method: str, path: str, *, params: Mapping[str, Any] | None = None, json: Any = None
    ) -> Any:
        call = _Call(method.upper(), path, dict(params or {}), json, retry=method.upper() == "GET")
        return await self._json(call)

    async def fetch(self, path: str, *, params: Mapping[str, Any] | None = None) -> bytes:
        return (await self._send(_Call("GET", path, dict(params or {})))).content


class AsyncJobs:
    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def create(
        self,
        spec: Mapping[str, Any],
        *,
        priority: int = 0,
        metadata: Mapping[str, str] | None = None,
        max_attempts: int = 3,
        idempotency_key: str | None = None,
    ) -> Job:
        call = _create_call(spec, priority, metadata, max_attempts, idempotency_key)
        return Job.from_json(await self._client._json(call))

    async def get(self, job_id: int) -> Job:
        return Job.from_json(await self._client._json(_Call("GET", f"/v1/jobs/{job_id}")))

    async def list(
        self, *, status: str | builtins.list[str] | None = None, page_size: int = 100
    ) -> AsyncIterator[Job]:
        statuses = ",".join([status] if isinstance(status, str) else status) if status else None
        after = None
        while True:
            page = await self._client._json(
                _Call("GET", "/v1/jobs", params=_page_params(after, page_size, status=statuses))
            )
            for item in page["data"]:
                yield Job.from_json(item)
            if not page["has_more"]:
                return
            after = page["next_cursor"]

    async def cancel(self, job_id: int) -> Job:
        return Job.from_json(
            await self._client._json(_Call("POST", f"/v1/jobs/{job_id}/cancel", retry=False))
        )

    async def wait(
        self, job_id: int, *, timeout: float | None = None, poll_interval: float = WAIT_POLL_S
    ) -> Job:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = await self.get(job_id)
            if job.finished:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} is still {job.status} after {timeout}s")
            await asyncio.sleep(poll_interval)

    async def metrics(
        self, job_id: int, *, follow: bool = False, split: str | None = None, name: str | None = None
    ) -> AsyncIterator[Metric]:
        if follow:
            async for message in self.stream(job_id):
                if message.event == "metric":
                    row = Metric.from_json(message.data)
                    if _metric_matches(row, split, name):
                        yield row
            return
        async for item in self._rows(f"/v1/jobs/{job_id}/metrics", split=split, name=name):
            yield Metric.from_json(item)

    async def events(self, job_id: int) -> AsyncIterator[Event]:
        async for item in self._rows(f"/v1/jobs/{job_id}/events"):
            yield Event.from_json(item)

    async def checkpoints(self, job_id: int) -> builtins.list[Checkpoint]:
        body = await self._client._json(_Call("GET", f"/v1/jobs/{job_id}/checkpoints"))
        return [Checkpoint.from_json(item) for item in body["data"]]

    async def logs(self, job_id: int, *, attempt: int | None = None, tail: int | None = None) -> str:
        params = {k: v for k, v in (("attempt", attempt), ("tail", tail)) if v is not None}
        return (await self._client._send(_Call("GET", f"/v1/jobs/{job_id}/logs", params=params))).text

    async def follow_logs(self, job_id: int, *, attempt: int | None = None) -> AsyncIterator[str]:
        async for message in self.stream(job_id, logs=True):
            if message.event == "log" and (attempt is None or message.data["attempt"] == attempt):
                yield str(message.data["text"])

    async def artifacts(self, job_id: int) -> builtins.list[Artifact]:
        body = await self._client._json(_Call("GET", f"/v1/jobs/{job_id}/artifacts"))
        return [Artifact.from_json(item) for item in body["data"]]

    async def download(
        self,
        job_id: int,
        dest: str | os.PathLike[str],
        *,
        checkpoint: int | None = None,
        path: str | None = None,
    ) -> Path:
        target = Path(dest)
        target.mkdir(parents=True, exist_ok=True)
        paths = _download_paths(checkpoint, path) or [
            a.path for a in await self.artifacts(job_id) if a.kind in DOWNLOAD_KINDS
        ]
        if not paths:
            raise ApiError(404, "not_found", f"job {job_id} has no model files yet")
        for item in paths:
            url = f"/v1/jobs/{job_id}/artifacts/{item}"
            async with self._client._http.stream("GET", url, timeout=_DOWNLOAD_TIMEOUT) as response:
                if not response.is_success:
                    await response.aread()
                    raise _error(response)
                is_tar = _is_tar(response)
                # tarfile reads synchronously: the bytes land in a file first, then are unpacked.
                partial = _partial_path(target, item, is_tar)
                with partial.open("wb") as handle:
                    async for chunk in response.aiter_bytes():
                        handle.write(chunk)
            _finish_download(partial, target, item, is_tar)
        return target

    async def stream(
        self, job_id: int, *, logs: bool = False, last_event_id: str | None = None
    ) -> AsyncIterator[StreamEvent]:
        failures = 0
        while True:
            headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
            try:
                async with self._client._http.stream(
                    "GET",
                    f"/v1/jobs/{job_id}/stream",
                    params={"logs": "true"} if logs else None,
                    headers=headers,
                    timeout=httpx.Timeout(DEFAULT_TIMEOUT_S, read=None),
                ) as response:
                    if not response.is_success:
                        await response.aread()
                        raise _error(response)
                    parser = _SSEParser()
                    async for line in response.aiter_lines():
                        message = parser.feed(line)
                        if message is None:
                            continue
                        failures = 0
                        last_event_id = message.id or last_event_id
                        yield message
                        if message.event == "end":
                            return
                error: Exception = httpx.RemoteProtocolError("the stream closed before the job ended")
            except httpx.TransportError as exc:
                error = exc
            failures += 1
            if failures > self._client.retries:
                raise _unreachable(self._client.base_url, error) from error
            await asyncio.sleep(_delay_s(failures, error))

    async def _rows(self, path: str, **filters: Any) -> AsyncIterator[dict[str, Any]]:
        after = None
        while True:
            page = await self._client._json(
                _Call("GET", path, params=_page_params(after, PAGE_ROWS, **filters))
            )
            for item in page["data"]:
                yield item
            if not page["has_more"]:
                return
            after = page["next_cursor"]


class AsyncWorkers:
    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def list(self) -> builtins.list[WorkerInfo]:
        body = await self._client._json(_Call("GET", "/v1/workers"))
        return [WorkerInfo.from_json(item) for item in body["data"]]
