"""The gluejobs Python client, sync and async, over httpx (and nothing else but the standard library).

    from gluejobs import Client

    with Client("http://127.0.0.1:8000", api_key="…") as client:
        job = client.jobs.create({"model_name_or_path": "bert-base-cased", "task_name": "mrpc"})
        for row in client.jobs.metrics(job.id, follow=True):
            print(row.step, row.split, row.name, row.value)
        client.jobs.download(job.id, "model/")

`AsyncClient` has the same methods, awaited (and `async for` over the iterators). Every error is
an `ApiError` carrying the API's error code, message and field. Failed requests are sent again with
backoff where that is safe (429 and 503 always, honouring `Retry-After`; other 5xx and lost
connections for reads and for `create`, which sends one Idempotency-Key for all its tries); a stream
reconnects with `Last-Event-ID` after a lost connection or an outage, losing and repeating nothing.
Downloads never write outside their folder (gluejobs/_download.py); answers held in memory and
stream lines are size-capped.

How it is built (after openai-python's `_base_client.py`): everything but the I/O is written once,
in gluejobs/_core.py, without I/O — requests, retry decisions, size caps, paging, SSE parsing and a
stream's reconnect bookkeeping — so each client class below holds only the I/O: `_exchange` (one
try), `_send` (tries until final), `_paginate`, and a stream's loop; a resource method is one line
naming its request and result type. The other route, writing the async client and generating the
sync one (httpcore's unasync), was not taken: it keeps a second full copy of the client in the tree
(the I/O-free core would still be wanted, to test the rules without a network) and needs a
generator and its check in CI; here the two classes share all decisions and differ only where
their I/O does.

The resources (`client.jobs`, `client.files` …) live in gluejobs/resources/, one module per resource
with its sync class and its async twin side by side; they reach the I/O through the two Protocols of
gluejobs/resources/_transport.py, which the classes below satisfy. Adding an endpoint: a function in
the resource's module that builds its request (a `Call`, the one place its URL is written), a line in
the sync class and its awaited twin; a new resource: its module, and a cached_property on each client.
"""

from __future__ import annotations

import asyncio
import builtins
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from functools import cached_property
from typing import Any, Generic, TypeVar

import httpx

from gluejobs._core import (
    CLIENT_KEEPALIVE_S,
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT_S,
    DEFAULT_URL,
    MAX_ANSWER_BYTES,
    MAX_STREAM_LINE_BYTES,
    Answer,
    Body,
    Call,
    Pages,
    Retry,
    RetryPolicy,
    StreamResume,
    data_of,
    query,
)
from gluejobs._download import DOWNLOAD_KINDS, Receiver
from gluejobs._types import (
    TERMINAL_STATUSES,
    ApiError,
    ApiKeyInfo,
    Artifact,
    AuditEntry,
    Checkpoint,
    CheckpointsRemoved,
    Event,
    FileInfo,
    Job,
    Metric,
    ModelInfo,
    OwnerInfo,
    Plan,
    Problem,
    Result,
    Search,
    StreamEvent,
    Sweep,
    SweepPlan,
    TaskLeaderboard,
    Webhook,
    WebhookDelivery,
    WorkerInfo,
)
from gluejobs.resources.files import AsyncFiles, Files
from gluejobs.resources.jobs import AsyncJobs, JobOptions, Jobs
from gluejobs.resources.keys import AsyncAudit, AsyncKeys, Audit, Keys
from gluejobs.resources.models import AsyncModels, Models
from gluejobs.resources.owners import OWNER_FIELDS, AsyncOwners, AsyncWorkers, Owners, Workers
from gluejobs.resources.searches import AsyncSearches, Searches, SearchOptions
from gluejobs.resources.sweeps import AsyncSweeps, SweepOptions, Sweeps
from gluejobs.resources.webhooks import AsyncWebhooks, Webhooks

__all__ = [
    "DEFAULT_RETRIES",
    "DEFAULT_TIMEOUT_S",
    "DEFAULT_URL",
    "DOWNLOAD_KINDS",
    "OWNER_FIELDS",
    "TERMINAL_STATUSES",
    "ApiError",
    "ApiKeyInfo",
    "Artifact",
    "AsyncAudit",
    "AsyncClient",
    "AsyncFiles",
    "AsyncJobs",
    "AsyncKeys",
    "AsyncModels",
    "AsyncOwners",
    "AsyncSearches",
    "AsyncSweeps",
    "AsyncWebhooks",
    "AsyncWorkers",
    "Audit",
    "AuditEntry",
    "Checkpoint",
    "CheckpointsRemoved",
    "Client",
    "Event",
    "FileInfo",
    "Files",
    "Job",
    "JobOptions",
    "Jobs",
    "Keys",
    "Metric",
    "ModelInfo",
    "Models",
    "OwnerInfo",
    "Owners",
    "Plan",
    "Problem",
    "RetryPolicy",
    "Search",
    "SearchOptions",
    "Searches",
    "StreamEvent",
    "Sweep",
    "SweepOptions",
    "SweepPlan",
    "Sweeps",
    "TaskLeaderboard",
    "Webhook",
    "WebhookDelivery",
    "Webhooks",
    "WorkerInfo",
    "Workers",
]

R = TypeVar("R", bound=Result)
T = TypeVar("T")
HttpT = TypeVar("HttpT", httpx.Client, httpx.AsyncClient)
TransportT = TypeVar("TransportT", httpx.BaseTransport, httpx.AsyncBaseTransport)


# The client's own requests (the resources' are in gluejobs/resources/).


def _leaderboard(task: str | None) -> Call:
    return Call("GET", "/v1/leaderboard", params=query(task=task))


def _any(method: str, path: str, params: Mapping[str, Any] | None, json: Any) -> Call:
    return Call(method.upper(), path, dict(params or {}), json, idempotent=method.upper() in ("GET", "HEAD"))


# ---------------------------------------------------------------------------------------------------
# What both client classes hold
# ---------------------------------------------------------------------------------------------------


class _BaseClient(Generic[HttpT, TransportT]):
    _http: HttpT

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        retries: int | RetryPolicy = DEFAULT_RETRIES,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        max_stream_line_bytes: int = MAX_STREAM_LINE_BYTES,
        transport: TransportT | None = None,
    ) -> None:
        """`base_url` and `api_key` default to GLUEJOBS_URL and GLUEJOBS_API_KEY. `retries`: how many
        times a failed request is sent again, or a RetryPolicy. Answers held in memory are refused
        past `max_answer_bytes`, a stream's line or event past `max_stream_line_bytes`."""
        self.base_url = (base_url or os.environ.get("GLUEJOBS_URL") or DEFAULT_URL).rstrip("/")
        api_key = api_key if api_key is not None else os.environ.get("GLUEJOBS_API_KEY")
        self._retry = retries if isinstance(retries, RetryPolicy) else RetryPolicy(retries=retries)
        self._max_answer_bytes = max_answer_bytes
        self._max_stream_line_bytes = max_stream_line_bytes
        headers = {"User-Agent": "gluejobs-client"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        # Redirects are followed: a download may be sent to a presigned URL of the store (httpx drops
        # the Authorization header when the redirect leaves the API's origin).
        # An idle connection is dropped here before the API drops it (GLUEJOBS_KEEP_ALIVE_S, 5 s by
        # default): reusing one the server is closing at that instant loses the request.
        self._http = self._open(
            transport,
            base_url=self.base_url,
            headers=headers,
            timeout=timeout,
            follow_redirects=True,
            limits=httpx.Limits(keepalive_expiry=CLIENT_KEEPALIVE_S),
        )

    @property
    def retries(self) -> int:
        return self._retry.retries

    def _open(self, transport: TransportT | None, **options: Any) -> HttpT:
        raise NotImplementedError

    def _body(self, response: httpx.Response) -> Body:
        return Body(response, self._max_answer_bytes)

    def _resume(self, call: Call, last_event_id: str | None) -> StreamResume:
        return StreamResume(
            Retry(call, self._retry, self.base_url), last_event_id, self._max_stream_line_bytes
        )


# ---------------------------------------------------------------------------------------------------
# The synchronous client
# ---------------------------------------------------------------------------------------------------


class Client(_BaseClient[httpx.Client, httpx.BaseTransport]):
    """A synchronous client of the gluejobs API."""

    # Made on first use (gluejobs/resources/).
    jobs = cached_property(lambda client: Jobs(client))
    sweeps = cached_property(lambda client: Sweeps(client))
    searches = cached_property(lambda client: Searches(client))
    files = cached_property(lambda client: Files(client))
    models = cached_property(lambda client: Models(client))
    workers = cached_property(lambda client: Workers(client))
    keys = cached_property(lambda client: Keys(client))  # admin keys only
    audit = cached_property(lambda client: Audit(client))
    owners = cached_property(lambda client: Owners(client))
    webhooks = cached_property(lambda client: Webhooks(client))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _open(self, transport: httpx.BaseTransport | None, **options: Any) -> httpx.Client:
        return httpx.Client(transport=transport, **options)

    def request(
        self, method: str, path: str, *, params: Mapping[str, Any] | None = None, json: Any = None
    ) -> Any:
        """Any other endpoint (sweeps, the leaderboard …): its decoded JSON, with the same errors;
        sent again after a failure that may have reached the server only when `method` is GET."""
        return self._send(_any(method, path, params, json)).json()

    def fetch(self, path: str, *, params: Mapping[str, Any] | None = None) -> bytes:
        """A GET endpoint's raw bytes (GLUE's submission zip …), retried, with the same errors."""
        return self._send(Call("GET", path, dict(params or {}))).content

    def leaderboard(self, *, task: str | None = None) -> builtins.list[TaskLeaderboard]:
        """Succeeded jobs and sweeps ranked by each task's main metric, beside the majority-class
        baseline: one board per task (only `task`'s when given)."""
        return self._all(_leaderboard(task), TaskLeaderboard)

    def _send(self, call: Call, into: Receiver | None = None) -> Answer:
        """`call`'s final answer, after as many tries as the retry rules allow (gluejobs/_core.py)."""
        retry = Retry(call, self._retry, self.base_url)
        while True:
            outcome = self._exchange(call, into)
            delay = retry.delay_s(outcome)
            if delay is None:
                return retry.result(outcome)
            time.sleep(delay)

    def _exchange(self, call: Call, into: Receiver | None) -> Answer | httpx.RequestError:
        """One try: the answer read whole (within its cap), or its body written `into` a file."""
        try:
            with call.sending() as options, self._http.stream(**options) as response:
                if into is None or not response.is_success:
                    return self._read(response)
                with into(response.headers) as handle:
                    for chunk in response.iter_bytes():
                        handle.write(chunk)
                return Answer.of(response)
        except httpx.RequestError as exc:
            return exc

    def _read(self, response: httpx.Response) -> Answer:
        body = self._body(response)
        for chunk in response.iter_bytes():
            body.add(chunk)
        return body.answer()

    def _one(self, call: Call, kind: type[R]) -> R:
        return kind.from_json(self._send(call).json())

    def _all(self, call: Call, kind: type[R]) -> builtins.list[R]:
        return [kind.from_json(row) for row in data_of(self._send(call).json())]

    def _paginate(self, call: Call, item: Callable[[Any], T]) -> Iterator[T]:
        pages = Pages(call)
        while (page := pages.next()) is not None:
            yield from map(item, pages.rows(self._send(page).json()))

    def _stream(self, call: Call, last_event_id: str | None) -> Iterator[StreamEvent]:
        resume = self._resume(call, last_event_id)
        outcome: Answer | httpx.RequestError | None
        while True:
            try:
                with self._http.stream(**resume.connect().http) as response:
                    if not response.is_success:
                        outcome = self._read(response)
                    else:
                        for chunk in response.iter_bytes():
                            yield from resume.feed(chunk)
                            if resume.ended:
                                return
                        outcome = None  # closed before the job ended
            except httpx.RequestError as exc:
                outcome = exc
            time.sleep(resume.lost(outcome))


# ---------------------------------------------------------------------------------------------------
# The asynchronous client: the same methods, awaited
# ---------------------------------------------------------------------------------------------------


class AsyncClient(_BaseClient[httpx.AsyncClient, httpx.AsyncBaseTransport]):
    """An asyncio client of the gluejobs API; see Client."""

    # Made on first use (gluejobs/resources/).
    jobs = cached_property(lambda client: AsyncJobs(client))
    sweeps = cached_property(lambda client: AsyncSweeps(client))
    searches = cached_property(lambda client: AsyncSearches(client))
    files = cached_property(lambda client: AsyncFiles(client))
    models = cached_property(lambda client: AsyncModels(client))
    workers = cached_property(lambda client: AsyncWorkers(client))
    keys = cached_property(lambda client: AsyncKeys(client))
    audit = cached_property(lambda client: AsyncAudit(client))
    owners = cached_property(lambda client: AsyncOwners(client))
    webhooks = cached_property(lambda client: AsyncWebhooks(client))

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    def _open(self, transport: httpx.AsyncBaseTransport | None, **options: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=transport, **options)

    async def request(
        self, method: str, path: str, *, params: Mapping[str, Any] | None = None, json: Any = None
    ) -> Any:
        return (await self._send(_any(method, path, params, json))).json()

    async def fetch(self, path: str, *, params: Mapping[str, Any] | None = None) -> bytes:
        return (await self._send(Call("GET", path, dict(params or {})))).content

    async def leaderboard(self, *, task: str | None = None) -> builtins.list[TaskLeaderboard]:
        return await self._all(_leaderboard(task), TaskLeaderboard)

    async def _send(self, call: Call, into: Receiver | None = None) -> Answer:
        retry = Retry(call, self._retry, self.base_url)
        while True:
            outcome = await self._exchange(call, into)
            delay = retry.delay_s(outcome)
            if delay is None:
                return retry.result(outcome)
            await asyncio.sleep(delay)

    async def _exchange(self, call: Call, into: Receiver | None) -> Answer | httpx.RequestError:
        try:
            with call.sending() as options:
                async with self._http.stream(**options) as response:
                    if into is None or not response.is_success:
                        return await self._read(response)
                    # The file is written synchronously: local disk, not the network.
                    with into(response.headers) as handle:
                        async for chunk in response.aiter_bytes():
                            handle.write(chunk)
                    return Answer.of(response)
        except httpx.RequestError as exc:
            return exc

    async def _read(self, response: httpx.Response) -> Answer:
        body = self._body(response)
        async for chunk in response.aiter_bytes():
            body.add(chunk)
        return body.answer()

    async def _one(self, call: Call, kind: type[R]) -> R:
        return kind.from_json((await self._send(call)).json())

    async def _all(self, call: Call, kind: type[R]) -> builtins.list[R]:
        return [kind.from_json(row) for row in data_of((await self._send(call)).json())]

    async def _paginate(self, call: Call, item: Callable[[Any], T]) -> AsyncIterator[T]:
        pages = Pages(call)
        while (page := pages.next()) is not None:
            for row in pages.rows((await self._send(page)).json()):
                yield item(row)

    async def _stream(self, call: Call, last_event_id: str | None) -> AsyncIterator[StreamEvent]:
        resume = self._resume(call, last_event_id)
        outcome: Answer | httpx.RequestError | None
        while True:
            try:
                async with self._http.stream(**resume.connect().http) as response:
                    if not response.is_success:
                        outcome = await self._read(response)
                    else:
                        async for chunk in response.aiter_bytes():
                            for event in resume.feed(chunk):
                                yield event
                            if resume.ended:
                                return
                        outcome = None  # closed before the job ended
            except httpx.RequestError as exc:
                outcome = exc
            await asyncio.sleep(resume.lost(outcome))
