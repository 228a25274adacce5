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
their I/O does. Adding an endpoint: a line in `Jobs` (or `Sweeps`) and its awaited twin in `AsyncJobs`.
"""

from __future__ import annotations

import asyncio
import builtins
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, Generic, TypedDict, TypeVar, Unpack
from urllib.parse import quote

import httpx

from gluejobs._admin import AsyncAudit, AsyncKeys, Audit, Keys
from gluejobs._core import (
    CLIENT_KEEPALIVE_S,
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT_S,
    DEFAULT_URL,
    MAX_ANSWER_BYTES,
    MAX_STREAM_LINE_BYTES,
    STREAM_IDLE_S,
    Answer,
    Body,
    Call,
    Pages,
    Retry,
    RetryPolicy,
    StreamResume,
    Waiting,
    data_of,
    query,
)
from gluejobs._download import DOWNLOAD_KINDS, MERGED, Download, Receiver, merge_spec, new_file
from gluejobs._files import LocalFile
from gluejobs._models import model_path, models_call, packed_folder, promote_call, upload_call
from gluejobs._searches import AsyncSearches, Searches, SearchOptions
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
from gluejobs._webhooks import AsyncWebhooks, Webhooks

__all__ = [
    "DEFAULT_RETRIES",
    "DEFAULT_TIMEOUT_S",
    "DEFAULT_URL",
    "DOWNLOAD_KINDS",
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
    "Client",
    "Event",
    "FileInfo",
    "Files",
    "Job",
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
    "SweepPlan",
    "Sweeps",
    "TaskLeaderboard",
    "Webhook",
    "WebhookDelivery",
    "Webhooks",
    "WorkerInfo",
    "Workers",
]

WAIT_POLL_S = 2.0
PAGE_ROWS = 1000
R = TypeVar("R", bound=Result)
T = TypeVar("T")
Destination = str | os.PathLike[str]
HttpT = TypeVar("HttpT", httpx.Client, httpx.AsyncClient)
TransportT = TypeVar("TransportT", httpx.BaseTransport, httpx.AsyncBaseTransport)


class JobOptions(TypedDict, total=False):
    """`jobs.create`'s options beside the spec (every other keyword argument is a spec field)."""

    priority: int  # default 0
    metadata: Mapping[str, str]
    max_attempts: int  # default 3
    idempotency_key: str  # generated when absent: one key for every try of this call


class SweepOptions(TypedDict, total=False):
    """`sweeps.create`'s options beside the spec."""

    seeds: Sequence[int]
    grid: Mapping[str, Sequence[Any]]
    priority: int
    metadata: Mapping[str, str]
    max_attempts: int


# ---------------------------------------------------------------------------------------------------
# The requests of each resource, built once for both clients
# ---------------------------------------------------------------------------------------------------


def _job_body(
    spec: Mapping[str, Any] | None, options: Mapping[str, Any]
) -> tuple[dict[str, Any], str | None]:
    """A job's body from a spec dict and/or keyword arguments (`model_name_or_path=…`): the options
    JobOptions names go beside the spec, every other keyword is a spec field. And its
    Idempotency-Key, if one was given."""
    if spec is not None and not isinstance(spec, Mapping):
        raise TypeError(f"the spec is a dict (or keyword arguments), not {type(spec).__name__}")
    fields = {k: v for k, v in options.items() if k not in JobOptions.__annotations__}
    body = {
        "spec": {**(spec or {}), **fields},
        "priority": options.get("priority", 0),
        "metadata": dict(options.get("metadata") or {}),
        "max_attempts": options.get("max_attempts", 3),
    }
    return body, options.get("idempotency_key")


def _create(spec: Mapping[str, Any] | None, options: Mapping[str, Any]) -> Call:
    body, key = _job_body(spec, options)
    # One key for every try: the API answers a repeat with the job the first try made.
    return Call("POST", "/v1/jobs", json=body, headers={"Idempotency-Key": key or str(uuid.uuid4())})


def _dry_run(spec: Mapping[str, Any] | None, options: Mapping[str, Any]) -> Call:
    # Stores nothing, so it is safe to send again.
    return Call("POST", "/v1/jobs", params={"dry_run": "true"}, json=_job_body(spec, options)[0])


def _sweep(spec: Mapping[str, Any], options: SweepOptions, *, dry_run: bool = False) -> Call:
    body = {
        "spec": dict(spec),
        "seeds": list(options.get("seeds") or []),
        "grid": {name: list(values) for name, values in (options.get("grid") or {}).items()},
        "priority": options.get("priority", 0),
        "metadata": dict(options.get("metadata") or {}),
        "max_attempts": options.get("max_attempts", 3),
    }
    params = {"dry_run": "true"} if dry_run else None
    # A sweep has no Idempotency-Key: a create is not sent again after a failure that may have
    # reached the server (it would queue the sweep twice); a dry run stores nothing.
    return Call("POST", "/v1/sweeps", params=params, json=body, idempotent=dry_run)


def _leaderboard(task: str | None) -> Call:
    return Call("GET", "/v1/leaderboard", params=query(task=task))


def _jobs(status: str | builtins.list[str] | None, page_size: int) -> Call:
    statuses = ",".join([status] if isinstance(status, str) else status) if status else None
    return Call("GET", "/v1/jobs", params=query(status=statuses, limit=page_size))


def _files(sha256: str | None, page_size: int) -> Call:
    return Call("GET", "/v1/files", params=query(sha256=sha256, limit=page_size))


def _rows(job_id: int, rows: str, **filters: Any) -> Call:
    return Call("GET", f"/v1/jobs/{job_id}/{rows}", params=query(limit=PAGE_ROWS, **filters))


def _prune_checkpoints(job_id: int, keep: Sequence[str] | None) -> Call:
    # Not sent again after a failure that may have reached the server: the second answer would not
    # list what the first removed.
    params = None if keep is None else {"keep": ",".join(keep)}
    return Call("DELETE", f"/v1/jobs/{job_id}/checkpoints", params=params, idempotent=False)


def _logs(job_id: int, attempt: int | None, tail: int | None) -> Call:
    return Call("GET", f"/v1/jobs/{job_id}/logs", params=query(attempt=attempt, tail=tail))


def _stream(job_id: int, logs: bool) -> Call:
    timeout = httpx.Timeout(DEFAULT_TIMEOUT_S, read=STREAM_IDLE_S)
    return Call(
        "GET", f"/v1/jobs/{job_id}/stream", params=query(logs="true" if logs else None), timeout=timeout
    )


def _any(method: str, path: str, params: Mapping[str, Any] | None, json: Any) -> Call:
    return Call(method.upper(), path, dict(params or {}), json, idempotent=method.upper() in ("GET", "HEAD"))


def _wanted_metric(message: StreamEvent, split: str | None, name: str | None) -> bool:
    data = message.data if message.event == "metric" and isinstance(message.data, dict) else {}
    return bool(data) and split in (None, data.get("split")) and name in (None, data.get("name"))


def _log_text(message: StreamEvent, attempt: int | None) -> bool:
    return message.event == "log" and attempt in (None, message.data["attempt"])


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

    # Made on first use; the resource classes come below.
    jobs = cached_property(lambda client: Jobs(client))
    sweeps = cached_property(lambda client: Sweeps(client))
    searches = cached_property(lambda client: Searches(client))  # gluejobs/_searches.py
    files = cached_property(lambda client: Files(client))
    models = cached_property(lambda client: Models(client))
    workers = cached_property(lambda client: Workers(client))
    keys = cached_property(lambda client: Keys(client))  # admin keys only (gluejobs/_admin.py)
    audit = cached_property(lambda client: Audit(client))
    owners = cached_property(lambda client: Owners(client))
    webhooks = cached_property(lambda client: Webhooks(client))  # gluejobs/_webhooks.py

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


class Jobs:
    """`client.jobs`: one line per endpoint; the requests are built above, the I/O is Client's."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def create(self, spec: Mapping[str, Any] | None = None, /, **options: Any) -> Job:
        """Queue a job: its spec as a dict, or its fields as keyword arguments
        (`create(model_name_or_path="bert-base-cased", task_name="mrpc")`), or both; JobOptions
        (priority, metadata, max_attempts, idempotency_key) beside them. Retried safely under one
        Idempotency-Key (generated unless given). The job's `warnings` say what the API accepted
        with a word of warning."""
        return self._c._one(_create(spec, options), Job)

    def dry_run(self, spec: Mapping[str, Any] | None = None, /, **options: Any) -> Plan:
        """The plan of the job `create` would queue (data checks, steps, tokens, memory, warnings),
        storing nothing."""
        return self._c._one(_dry_run(spec, options), Plan)

    def rerun(self, job_id: int) -> Job:
        """Queue the job's exact spec again (same seed); once both have finished, `get(rerun.id)`
        has `reproduction`: whether the metrics matched."""
        return self._c._one(Call("POST", f"/v1/jobs/{job_id}/rerun", idempotent=False), Job)

    def get(self, job_id: int) -> Job:
        return self._c._one(Call("GET", f"/v1/jobs/{job_id}"), Job)

    def list(self, *, status: str | builtins.list[str] | None = None, page_size: int = 100) -> Iterator[Job]:
        """Every job (newest first) with that status, page after page."""
        return self._c._paginate(_jobs(status, page_size), Job.from_json)

    def cancel(self, job_id: int) -> Job:
        # Not sent again after a failure that may have reached the server: a second cancel of a job
        # the first one cancelled answers 409.
        return self._c._one(Call("POST", f"/v1/jobs/{job_id}/cancel", idempotent=False), Job)

    def wait(self, job_id: int, *, timeout: float | None = None, poll_interval: float = WAIT_POLL_S) -> Job:
        """The job once it has finished; TimeoutError after `timeout` seconds."""
        waiting = Waiting(job_id, timeout)
        while not waiting.over(job := self.get(job_id)):
            time.sleep(poll_interval)
        return job

    def metrics(
        self, job_id: int, *, follow: bool = False, split: str | None = None, name: str | None = None
    ) -> Iterator[Metric]:
        """The job's metric rows in order; with `follow`, new rows as they come until the job ends."""
        if follow:
            return (Metric.from_json(m.data) for m in self.stream(job_id) if _wanted_metric(m, split, name))
        return self._c._paginate(_rows(job_id, "metrics", split=split, name=name), Metric.from_json)

    def events(self, job_id: int) -> Iterator[Event]:
        return self._c._paginate(_rows(job_id, "events"), Event.from_json)

    def checkpoints(self, job_id: int) -> builtins.list[Checkpoint]:
        return self._c._all(Call("GET", f"/v1/jobs/{job_id}/checkpoints"), Checkpoint)

    def prune_checkpoints(self, job_id: int, *, keep: Sequence[str] | None = None) -> CheckpointsRemoved:
        """Remove a finished job's checkpoints but its best one (and, when it did not succeed, its
        newest), or but those `keep` names ("checkpoint-300"; [] keeps none). Its final model stays."""
        return self._c._one(_prune_checkpoints(job_id, keep), CheckpointsRemoved)

    def logs(self, job_id: int, *, attempt: int | None = None, tail: int | None = None) -> str:
        return self._c._send(_logs(job_id, attempt, tail)).text

    def follow_logs(self, job_id: int, *, attempt: int | None = None) -> Iterator[str]:
        """The job's log text from the start, then as it is written, until the job ends."""
        return (str(m.data["text"]) for m in self.stream(job_id, logs=True) if _log_text(m, attempt))

    def artifacts(self, job_id: int) -> builtins.list[Artifact]:
        return self._c._all(Call("GET", f"/v1/jobs/{job_id}/artifacts"), Artifact)

    def stream(
        self, job_id: int, *, logs: bool = False, last_event_id: str | None = None
    ) -> Iterator[StreamEvent]:
        """The job's live stream (metric, checkpoint, status, event, log, end) until the job ends,
        reconnecting after a lost connection or an outage where it left off (Last-Event-ID)."""
        return self._c._stream(_stream(job_id, logs), last_event_id)

    def download(
        self, job_id: int, dest: Destination, *, checkpoint: int | None = None, path: str | None = None
    ) -> Path:
        """Download into `dest`: the final model (and predictions) by default, a checkpoint's folder
        with `checkpoint=STEP`, or one file or folder with `path=`. Returns `dest`. Refuses (ApiError
        `unsafe_path`) any path that would land outside `dest`, before writing anything for it."""
        target = Download(job_id, dest, checkpoint=checkpoint, path=path)
        for item in target.requested or target.choose(self.artifacts(job_id)):
            self._c._send(target.call(item), into=target.receiver(item))
        return target.root

    def download_merged(
        self, job_id: int, dest: Destination, *, checkpoint: int | None = None, timeout: float | None = None
    ) -> Path:
        """A LoRA job's adapter (its final one, or its checkpoint at step `checkpoint`) merged into its
        base, a full model that `from_pretrained` loads, into `dest`; returns `dest`. A LoRA job that
        saved its merged model (save_merged_model) gives it; otherwise this queues the job that saves
        it (an evaluation of one row from `job:ID…` with save_merged_model), waits for it (`timeout`
        seconds at most: TimeoutError) and downloads its merged model. ApiError 422 for a job without
        LoRA, and as the API answers the job (404, 409 before the adapter exists)."""
        source = self.get(job_id)
        spec = merge_spec(job_id, source.spec, checkpoint)
        if checkpoint is None and source.spec.get("save_merged_model") and source.status == "succeeded":
            return _merged_folder(self.download(job_id, dest, path=MERGED))
        merge = self.wait(self.create(spec).id, timeout=timeout)
        if merge.status != "succeeded":
            raise ApiError(
                409,
                "conflict",
                f"job {merge.id}, which merges job {job_id}'s adapter, {merge.status}: {merge.error}",
            )
        return _merged_folder(self.download(merge.id, dest, path=MERGED))


class Sweeps:
    """`client.sweeps`: one job per combination of seeds and grid values, and statistics over seeds."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def create(self, spec: Mapping[str, Any], **options: Unpack[SweepOptions]) -> Sweep:
        """Queue the sweep (`seeds=[0, 1, 2]`, `grid={"learning_rate": [1e-4, 5e-4]}`); not sent again
        after a failure that may have reached the server."""
        return self._c._one(_sweep(spec, options), Sweep)

    def dry_run(self, spec: Mapping[str, Any], **options: Unpack[SweepOptions]) -> SweepPlan:
        """Every combination checked and resolved, storing nothing."""
        return self._c._one(_sweep(spec, options, dry_run=True), SweepPlan)

    def get(self, sweep_id: int) -> Sweep:
        """The sweep with its per-configuration statistics and winner."""
        return self._c._one(Call("GET", f"/v1/sweeps/{sweep_id}"), Sweep)

    def list(self, *, page_size: int = 100) -> Iterator[Sweep]:
        return self._c._paginate(Call("GET", "/v1/sweeps", params={"limit": page_size}), Sweep.from_json)

    def cancel(self, sweep_id: int) -> Sweep:
        return self._c._one(Call("POST", f"/v1/sweeps/{sweep_id}/cancel", idempotent=False), Sweep)


class Files:
    """`client.files`: uploaded data files."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def create(
        self,
        path: Destination,
        *,
        purpose: str = "train",
        task_name: str | None = None,
        columns: Mapping[str, str] | None = None,
    ) -> FileInfo:
        """Upload a data file for jobs to name by its id; hashed first, and not sent at all when the
        API already holds those bytes for you (your file with them is returned). Checked as it lands
        (labels against `task_name`'s task when given; texts and labels from the columns `columns`
        maps, {"text_column": "review", "label_column": "sentiment"}, as a spec maps them): ApiError
        422 naming the problem."""
        local = LocalFile.read(path)
        existing = local.reusable(self.list(sha256=local.sha256), columns)
        call = local.upload(purpose=purpose, task_name=task_name, columns=columns)
        return existing or self._c._one(call, FileInfo)

    def check(
        self,
        path: Destination,
        *,
        purpose: str = "train",
        task_name: str | None = None,
        columns: Mapping[str, str] | None = None,
    ) -> Any:
        """The API's checks of a local file (rows, columns, labels), keeping nothing."""
        call = LocalFile.read(path).upload(
            purpose=purpose, task_name=task_name, dry_run=True, columns=columns
        )
        return self._c._send(call).json()

    def list(self, *, sha256: str | None = None, page_size: int = 100) -> Iterator[FileInfo]:
        return self._c._paginate(_files(sha256, page_size), FileInfo.from_json)

    def get(self, file_id: str) -> FileInfo:
        return self._c._one(Call("GET", f"/v1/files/{file_id}"), FileInfo)

    def delete(self, file_id: str) -> None:
        """Delete the file (409 while a queued or running job uses it)."""
        self._c._send(Call("DELETE", f"/v1/files/{file_id}"))

    def download(self, file_id: str, dest: Destination) -> Path:
        """The file's bytes into the file `dest` (written whole, or not at all)."""
        target = Path(dest)
        self._c._send(Call("GET", f"/v1/files/{file_id}/content"), into=lambda _h: new_file(target))
        return target


class Models:
    """`client.models`: model folders registered once, named in a spec as `model:NAME`."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def upload(self, folder: Destination, *, name: str) -> ModelInfo:
        """Register a local model folder under `name` (packed as a tar and sent whole; checked as it
        lands: ApiError 422 naming the problem, 409 when you have a model of that name)."""
        with packed_folder(folder) as tar_path:
            return self._c._one(upload_call(tar_path, name), ModelInfo)

    def promote(self, job_id: int, *, name: str, checkpoint: str | int | None = None) -> ModelInfo:
        """Register job `job_id`'s final model (or `checkpoint`: one it declared, `checkpoint-300` or
        300, or `best`) as your model `name`, without moving its bytes: the API's store copies them.
        ApiError 404 for a job you cannot see, 409 when the name is taken or the job has not
        succeeded, 422 for a checkpoint it did not declare or a LoRA job's adapter."""
        return self._c._one(promote_call(job_id, name, checkpoint), ModelInfo)

    def list(self, *, page_size: int = 100) -> Iterator[ModelInfo]:
        return self._c._paginate(models_call(page_size), ModelInfo.from_json)

    def get(self, name: str, *, owner: str | None = None) -> ModelInfo:
        """One model (`owner`: admins, another owner's)."""
        path, params = model_path(name, owner)
        return self._c._one(Call("GET", path, params), ModelInfo)

    def delete(self, name: str, *, owner: str | None = None) -> None:
        """Delete the model (409 while a queued or running job uses it)."""
        path, params = model_path(name, owner)
        self._c._send(Call("DELETE", path, params))


def _owner_update(name: str, quota: Mapping[str, Any]) -> Call:
    """PATCH /v1/owners/{name}: only the fields given (None: back to the configured default)."""
    unknown = set(quota) - set(OWNER_FIELDS)
    if unknown:
        raise TypeError(f"unknown owner setting(s) {sorted(unknown)}; expected {', '.join(OWNER_FIELDS)}")
    return Call("PATCH", f"/v1/owners/{quote(name, safe='')}", json=dict(quota))


OWNER_FIELDS = ("share", "max_devices", "max_queued", "max_device_hours_per_day", "max_storage_bytes")


class Owners:
    """`client.owners`: the queue by owner, and (admin keys) each owner's share and quotas."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def list(self) -> builtins.list[OwnerInfo]:
        return self._c._all(Call("GET", "/v1/owners"), OwnerInfo)

    def update(self, name: str, **quota: Any) -> OwnerInfo:
        return self._c._one(_owner_update(name, quota), OwnerInfo)


class Workers:
    def __init__(self, client: Client) -> None:
        self._c = client

    def list(self) -> builtins.list[WorkerInfo]:
        return self._c._all(Call("GET", "/v1/workers"), WorkerInfo)


# ---------------------------------------------------------------------------------------------------
# The asynchronous client: the same methods, awaited
# ---------------------------------------------------------------------------------------------------


class AsyncClient(_BaseClient[httpx.AsyncClient, httpx.AsyncBaseTransport]):
    """An asyncio client of the gluejobs API; see Client."""

    # Made on first use; the resource classes come below.
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


class AsyncJobs:
    """`client.jobs` of AsyncClient: Jobs' methods, awaited."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(self, spec: Mapping[str, Any] | None = None, /, **options: Any) -> Job:
        return await self._c._one(_create(spec, options), Job)

    async def dry_run(self, spec: Mapping[str, Any] | None = None, /, **options: Any) -> Plan:
        return await self._c._one(_dry_run(spec, options), Plan)

    async def rerun(self, job_id: int) -> Job:
        return await self._c._one(Call("POST", f"/v1/jobs/{job_id}/rerun", idempotent=False), Job)

    async def get(self, job_id: int) -> Job:
        return await self._c._one(Call("GET", f"/v1/jobs/{job_id}"), Job)

    def list(
        self, *, status: str | builtins.list[str] | None = None, page_size: int = 100
    ) -> AsyncIterator[Job]:
        return self._c._paginate(_jobs(status, page_size), Job.from_json)

    async def cancel(self, job_id: int) -> Job:
        return await self._c._one(Call("POST", f"/v1/jobs/{job_id}/cancel", idempotent=False), Job)

    async def wait(
        self, job_id: int, *, timeout: float | None = None, poll_interval: float = WAIT_POLL_S
    ) -> Job:
        waiting = Waiting(job_id, timeout)
        while not waiting.over(job := await self.get(job_id)):
            await asyncio.sleep(poll_interval)
        return job

    def metrics(
        self, job_id: int, *, follow: bool = False, split: str | None = None, name: str | None = None
    ) -> AsyncIterator[Metric]:
        if follow:
            return (
                Metric.from_json(m.data) async for m in self.stream(job_id) if _wanted_metric(m, split, name)
            )
        return self._c._paginate(_rows(job_id, "metrics", split=split, name=name), Metric.from_json)

    def events(self, job_id: int) -> AsyncIterator[Event]:
        return self._c._paginate(_rows(job_id, "events"), Event.from_json)

    async def checkpoints(self, job_id: int) -> builtins.list[Checkpoint]:
        return await self._c._all(Call("GET", f"/v1/jobs/{job_id}/checkpoints"), Checkpoint)

    async def prune_checkpoints(
        self, job_id: int, *, keep: Sequence[str] | None = None
    ) -> CheckpointsRemoved:
        """As Jobs.prune_checkpoints."""
        return await self._c._one(_prune_checkpoints(job_id, keep), CheckpointsRemoved)

    async def logs(self, job_id: int, *, attempt: int | None = None, tail: int | None = None) -> str:
        return (await self._c._send(_logs(job_id, attempt, tail))).text

    def follow_logs(self, job_id: int, *, attempt: int | None = None) -> AsyncIterator[str]:
        return (str(m.data["text"]) async for m in self.stream(job_id, logs=True) if _log_text(m, attempt))

    async def artifacts(self, job_id: int) -> builtins.list[Artifact]:
        return await self._c._all(Call("GET", f"/v1/jobs/{job_id}/artifacts"), Artifact)

    def stream(
        self, job_id: int, *, logs: bool = False, last_event_id: str | None = None
    ) -> AsyncIterator[StreamEvent]:
        return self._c._stream(_stream(job_id, logs), last_event_id)

    async def download(
        self, job_id: int, dest: Destination, *, checkpoint: int | None = None, path: str | None = None
    ) -> Path:
        target = Download(job_id, dest, checkpoint=checkpoint, path=path)
        for item in target.requested or target.choose(await self.artifacts(job_id)):
            await self._c._send(target.call(item), into=target.receiver(item))
        return target.root

    async def download_merged(
        self, job_id: int, dest: Destination, *, checkpoint: int | None = None, timeout: float | None = None
    ) -> Path:
        source = await self.get(job_id)
        spec = merge_spec(job_id, source.spec, checkpoint)
        if checkpoint is None and source.spec.get("save_merged_model") and source.status == "succeeded":
            return _merged_folder(await self.download(job_id, dest, path=MERGED))
        merge = await self.wait((await self.create(spec)).id, timeout=timeout)
        if merge.status != "succeeded":
            raise ApiError(
                409,
                "conflict",
                f"job {merge.id}, which merges job {job_id}'s adapter, {merge.status}: {merge.error}",
            )
        return _merged_folder(await self.download(merge.id, dest, path=MERGED))


class AsyncSweeps:
    """`client.sweeps` of AsyncClient: Sweeps' methods, awaited."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(self, spec: Mapping[str, Any], **options: Unpack[SweepOptions]) -> Sweep:
        return await self._c._one(_sweep(spec, options), Sweep)

    async def dry_run(self, spec: Mapping[str, Any], **options: Unpack[SweepOptions]) -> SweepPlan:
        return await self._c._one(_sweep(spec, options, dry_run=True), SweepPlan)

    async def get(self, sweep_id: int) -> Sweep:
        return await self._c._one(Call("GET", f"/v1/sweeps/{sweep_id}"), Sweep)

    def list(self, *, page_size: int = 100) -> AsyncIterator[Sweep]:
        return self._c._paginate(Call("GET", "/v1/sweeps", params={"limit": page_size}), Sweep.from_json)

    async def cancel(self, sweep_id: int) -> Sweep:
        return await self._c._one(Call("POST", f"/v1/sweeps/{sweep_id}/cancel", idempotent=False), Sweep)


class AsyncFiles:
    """`client.files` of AsyncClient: Files' methods, awaited."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(
        self,
        path: Destination,
        *,
        purpose: str = "train",
        task_name: str | None = None,
        columns: Mapping[str, str] | None = None,
    ) -> FileInfo:
        local = LocalFile.read(path)
        existing = local.reusable([row async for row in self.list(sha256=local.sha256)], columns)
        call = local.upload(purpose=purpose, task_name=task_name, columns=columns)
        return existing or await self._c._one(call, FileInfo)

    async def check(
        self,
        path: Destination,
        *,
        purpose: str = "train",
        task_name: str | None = None,
        columns: Mapping[str, str] | None = None,
    ) -> Any:
        call = LocalFile.read(path).upload(
            purpose=purpose, task_name=task_name, dry_run=True, columns=columns
        )
        return (await self._c._send(call)).json()

    def list(self, *, sha256: str | None = None, page_size: int = 100) -> AsyncIterator[FileInfo]:
        return self._c._paginate(_files(sha256, page_size), FileInfo.from_json)

    async def get(self, file_id: str) -> FileInfo:
        return await self._c._one(Call("GET", f"/v1/files/{file_id}"), FileInfo)

    async def delete(self, file_id: str) -> None:
        await self._c._send(Call("DELETE", f"/v1/files/{file_id}"))

    async def download(self, file_id: str, dest: Destination) -> Path:
        target = Path(dest)
        await self._c._send(Call("GET", f"/v1/files/{file_id}/content"), into=lambda _h: new_file(target))
        return target


class AsyncModels:
    """`client.models` of AsyncClient: Models' methods, awaited."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def upload(self, folder: Destination, *, name: str) -> ModelInfo:
        with packed_folder(folder) as tar_path:
            return await self._c._one(upload_call(tar_path, name), ModelInfo)

    async def promote(self, job_id: int, *, name: str, checkpoint: str | int | None = None) -> ModelInfo:
        return await self._c._one(promote_call(job_id, name, checkpoint), ModelInfo)

    def list(self, *, page_size: int = 100) -> AsyncIterator[ModelInfo]:
        return self._c._paginate(models_call(page_size), ModelInfo.from_json)

    async def get(self, name: str, *, owner: str | None = None) -> ModelInfo:
        path, params = model_path(name, owner)
        return await self._c._one(Call("GET", path, params), ModelInfo)

    async def delete(self, name: str, *, owner: str | None = None) -> None:
        path, params = model_path(name, owner)
        await self._c._send(Call("DELETE", path, params))


class AsyncOwners:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def list(self) -> builtins.list[OwnerInfo]:
        return await self._c._all(Call("GET", "/v1/owners"), OwnerInfo)

    async def update(self, name: str, **quota: Any) -> OwnerInfo:
        return await self._c._one(_owner_update(name, quota), OwnerInfo)


class AsyncWorkers:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def list(self) -> builtins.list[WorkerInfo]:
        return await self._c._all(Call("GET", "/v1/workers"), WorkerInfo)


def _merged_folder(root: Path) -> Path:
    """The downloaded merged model: `root/merged` (a folder comes under its own name)."""
    return root / MERGED if (root / MERGED).is_dir() else root
