"""`client.jobs`, sync and async: queue, follow, wait for and download jobs. Each request is built
once, by the functions at the top (one per endpoint), and sent through the client's I/O
(resources/_transport.py); `AsyncJobs` is `Jobs` awaited."""

from __future__ import annotations

import asyncio
import builtins
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

import httpx

from gluejobs._core import DEFAULT_TIMEOUT_S, STREAM_IDLE_S, Call, Waiting, query
from gluejobs._download import MERGED, Download, merge_spec
from gluejobs._types import (
    ApiError,
    Artifact,
    Checkpoint,
    CheckpointsRemoved,
    Event,
    Job,
    Metric,
    Plan,
    StreamEvent,
)
from gluejobs.resources._transport import AsyncTransport, Destination, SyncTransport

WAIT_POLL_S = 2.0
PAGE_ROWS = 1000


class JobOptions(TypedDict, total=False):
    """`jobs.create`'s options beside the spec (every other keyword argument is a spec field)."""

    priority: int  # default 0
    metadata: Mapping[str, str]
    max_attempts: int  # default 3
    idempotency_key: str  # generated when absent: one key for every try of this call


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


def _submit(body: dict[str, Any], *, dry_run: bool = False, key: str | None = None) -> Call:
    if dry_run:  # stores nothing, so it is safe to send again
        return Call("POST", "/v1/jobs", params={"dry_run": "true"}, json=body)
    # One key for every try: the API answers a repeat with the job the first try made.
    return Call("POST", "/v1/jobs", json=body, headers={"Idempotency-Key": key or str(uuid.uuid4())})


def _create(spec: Mapping[str, Any] | None, options: Mapping[str, Any]) -> Call:
    body, key = _job_body(spec, options)
    return _submit(body, key=key)


def _dry_run(spec: Mapping[str, Any] | None, options: Mapping[str, Any]) -> Call:
    return _submit(_job_body(spec, options)[0], dry_run=True)


def _list(status: str | builtins.list[str] | None, page_size: int) -> Call:
    statuses = ",".join([status] if isinstance(status, str) else status) if status else None
    return Call("GET", "/v1/jobs", params=query(status=statuses, limit=page_size))


def _get(job_id: int) -> Call:
    return Call("GET", f"/v1/jobs/{job_id}")


def _rerun(job_id: int) -> Call:
    # Not sent again after a failure that may have reached the server: it would queue a second rerun.
    return Call("POST", f"/v1/jobs/{job_id}/rerun", idempotent=False)


def _cancel(job_id: int) -> Call:
    # Not sent again after a failure that may have reached the server: a second cancel of a job
    # the first one cancelled answers 409.
    return Call("POST", f"/v1/jobs/{job_id}/cancel", idempotent=False)


def _metrics(job_id: int, split: str | None, name: str | None) -> Call:
    return Call("GET", f"/v1/jobs/{job_id}/metrics", params=query(limit=PAGE_ROWS, split=split, name=name))


def _events(job_id: int) -> Call:
    return Call("GET", f"/v1/jobs/{job_id}/events", params=query(limit=PAGE_ROWS))


def _checkpoints(job_id: int) -> Call:
    return Call("GET", f"/v1/jobs/{job_id}/checkpoints")


def _prune_checkpoints(job_id: int, keep: Sequence[str] | None) -> Call:
    # Not sent again after a failure that may have reached the server: the second answer would not
    # list what the first removed.
    params = None if keep is None else {"keep": ",".join(keep)}
    return Call("DELETE", f"/v1/jobs/{job_id}/checkpoints", params=params, idempotent=False)


def _logs(job_id: int, attempt: int | None, tail: int | None) -> Call:
    return Call("GET", f"/v1/jobs/{job_id}/logs", params=query(attempt=attempt, tail=tail))


def _artifacts(job_id: int) -> Call:
    return Call("GET", f"/v1/jobs/{job_id}/artifacts")


def _stream(job_id: int, logs: bool) -> Call:
    timeout = httpx.Timeout(DEFAULT_TIMEOUT_S, read=STREAM_IDLE_S)
    return Call(
        "GET", f"/v1/jobs/{job_id}/stream", params=query(logs="true" if logs else None), timeout=timeout
    )


def _wanted_metric(message: StreamEvent, split: str | None, name: str | None) -> bool:
    data = message.data if message.event == "metric" and isinstance(message.data, dict) else {}
    return bool(data) and split in (None, data.get("split")) and name in (None, data.get("name"))


def _log_text(message: StreamEvent, attempt: int | None) -> bool:
    return message.event == "log" and attempt in (None, message.data["attempt"])


def _merge_failed(job_id: int, merge: Job) -> ApiError:
    return ApiError(
        409, "conflict", f"job {merge.id}, which merges job {job_id}'s adapter, {merge.status}: {merge.error}"
    )


def _merged_folder(root: Path) -> Path:
    """The downloaded merged model: `root/merged` (a folder comes under its own name)."""
    return root / MERGED if (root / MERGED).is_dir() else root


class Jobs:
    """`client.jobs`: one line per endpoint; the requests are built above, the I/O is Client's."""

    def __init__(self, client: SyncTransport) -> None:
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
        return self._c._one(_rerun(job_id), Job)

    def get(self, job_id: int) -> Job:
        return self._c._one(_get(job_id), Job)

    def list(self, *, status: str | builtins.list[str] | None = None, page_size: int = 100) -> Iterator[Job]:
        """Every job (newest first) with that status, page after page."""
        return self._c._paginate(_list(status, page_size), Job.from_json)

    def cancel(self, job_id: int) -> Job:
        return self._c._one(_cancel(job_id), Job)

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
        return self._c._paginate(_metrics(job_id, split, name), Metric.from_json)

    def events(self, job_id: int) -> Iterator[Event]:
        return self._c._paginate(_events(job_id), Event.from_json)

    def checkpoints(self, job_id: int) -> builtins.list[Checkpoint]:
        return self._c._all(_checkpoints(job_id), Checkpoint)

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
        return self._c._all(_artifacts(job_id), Artifact)

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
            raise _merge_failed(job_id, merge)
        return _merged_folder(self.download(merge.id, dest, path=MERGED))


class AsyncJobs:
    """`client.jobs` of AsyncClient: Jobs' methods, awaited."""

    def __init__(self, client: AsyncTransport) -> None:
        self._c = client

    async def create(self, spec: Mapping[str, Any] | None = None, /, **options: Any) -> Job:
        return await self._c._one(_create(spec, options), Job)

    async def dry_run(self, spec: Mapping[str, Any] | None = None, /, **options: Any) -> Plan:
        return await self._c._one(_dry_run(spec, options), Plan)

    async def rerun(self, job_id: int) -> Job:
        return await self._c._one(_rerun(job_id), Job)

    async def get(self, job_id: int) -> Job:
        return await self._c._one(_get(job_id), Job)

    def list(
        self, *, status: str | builtins.list[str] | None = None, page_size: int = 100
    ) -> AsyncIterator[Job]:
        return self._c._paginate(_list(status, page_size), Job.from_json)

    async def cancel(self, job_id: int) -> Job:
        return await self._c._one(_cancel(job_id), Job)

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
        return self._c._paginate(_metrics(job_id, split, name), Metric.from_json)

    def events(self, job_id: int) -> AsyncIterator[Event]:
        return self._c._paginate(_events(job_id), Event.from_json)

    async def checkpoints(self, job_id: int) -> builtins.list[Checkpoint]:
        return await self._c._all(_checkpoints(job_id), Checkpoint)

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
        return await self._c._all(_artifacts(job_id), Artifact)

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
            raise _merge_failed(job_id, merge)
        return _merged_folder(await self.download(merge.id, dest, path=MERGED))
