"""Where everything a job reads and writes lives: uploaded files, checkpoints, the final model,
predictions, GLUE submission files, logs and tracker files. One setting chooses it:

- GLUEJOBS_STORAGE_URL unset: the local folder GLUEJOBS_ARTIFACTS_DIR, laid out as before
  (`jobs/<id>/…`, plus `files/<sha256>` for uploads). A worker writes a job's folder in place, so
  one machine (or a fleet on a shared disk) copies nothing.
- `s3://bucket/prefix`: any S3-compatible store (MinIO, Ceph, R2, GCS's S3 API, AWS). The endpoint
  and the credentials come from the standard AWS environment and config (AWS_ENDPOINT_URL,
  AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ~/.aws/config …), as every AWS tool reads
  them. A worker then writes a job's folder on its own disk and mirrors it here
   (worker/training/job_storage.py).

Why fsspec (with s3fs for S3): one file-system interface for the local folder and the object store,
so every caller is written once; s3fs signs its requests through botocore (no signing of our own),
streams uploads in multipart pieces and downloads in ranges, and `sign()` gives presigned URLs.
boto3 was the alternative: the S3 half alone, with a second code path for the local folder.

The store may be briefly unreachable (a restart, a failover): every operation is retried with
capped, jittered backoff (shared.core.db_retries.Backoff, as for the database) for up to
GLUEJOBS_STORAGE_RETRY_S, then StoreUnavailable, which a job's process reports as
`storage_unreachable` (retried as a new attempt) and the API as 503.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any, TypeVar

from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem

from shared.core.config import Settings
from shared.core.db_retries import Backoff
from shared.core.errors import GluejobsError
from shared.core.faults import crash_point

# A job's folder's key: its home is the job folder's layout (the client reads it too); a name here
# too for the server's callers that hold a Store.
from shared.wire.job_folder import job_key as job_key

logger = logging.getLogger(__name__)

T = TypeVar("T")

FILES = "files"  # uploaded files, by content: files/<sha256>
# (jobs/<id>/…, a job's folder, and the keys inside it: shared/wire/job_folder.py, which the client reads too)
MODELS = "models"  # registered models: models/blobs/<sha256>, models/manifests/<sha256>.json
# S3 multipart pieces, sent one at a time: what an upload holds in memory (S3's minimum part is
# 5 MiB; s3fs's defaults, 50 MiB parts ten at a time, would hold half a gigabyte). Measured on a
# 200 MiB upload through the API (tests/service/test_files_api.py): peak RSS +31 MiB; two at a time, +48.
PART_BYTES = 8 * 1024 * 1024
PARTS_AT_ONCE = 1
# Errors with these numbers are the store's or the network's passing trouble (s3fs maps S3's
# InternalError to EREMOTEIO, SlowDown and ServiceUnavailable to EBUSY/EAGAIN; its FileExpired, an
# object replaced while a file object read it in pieces, is EBUSY too: reading again reads the new one).
_TRANSIENT_ERRNOS = frozenset(
    {errno.EREMOTEIO, errno.EBUSY, errno.EAGAIN, errno.ETIMEDOUT, errno.ECONNREFUSED, errno.ECONNRESET}
)
# botocore's and aiohttp's connection failures, by name: the client-only install has neither.
_TRANSIENT_NAMES = frozenset(
    {
        "EndpointConnectionError",
        "ConnectionClosedError",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "HTTPClientError",
        "ResponseStreamingError",
        "ClientConnectorError",
        "ClientOSError",
        "ServerDisconnectedError",
        "ClientPayloadError",
        "FSTimeoutError",
    }
)
OUTAGE_LOG_INTERVAL_S = 10.0


class StoreUnavailable(GluejobsError):
    """The file store could not be reached (GLUEJOBS_STORAGE_URL); try again shortly."""

    status_code = 503
    code = "storage_unavailable"
    # A job's process that gives up on the store hands the job to a new attempt, never fails it.
    failure_code = "storage_unreachable"
    # The API's 503 says when to try again (Retry-After), as its database_unavailable does.
    retry_after_s = 5


def is_transient(exc: BaseException) -> bool:
    """Whether `exc` says the store could not be reached or was busy (retry), not that the request
    was wrong (a missing object, a denied key: retrying cannot help)."""
    for cause in (exc, exc.__cause__, exc.__context__):
        if cause is None:
            continue
        if isinstance(cause, (ConnectionError, TimeoutError)):
            return True
        if isinstance(cause, OSError) and cause.errno in _TRANSIENT_ERRNOS:
            return True
        if any(kind.__name__ in _TRANSIENT_NAMES for kind in type(cause).__mro__):
            return True
    return False


@dataclass(frozen=True)
class StoredFile:
    path: str  # relative to the prefix that was listed, with forward slashes
    size: int
    modified: datetime


class Store:
    """The store of one deployment: keys are relative paths (`jobs/7/model.safetensors`)."""

    def __init__(
        self, fs: AbstractFileSystem, root: str, *, url: str, local_root: Path | None, retry_s: float
    ) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.url = url
        self.local_root = local_root  # the folder itself, when the store is a local folder
        self.retry_s = retry_s

    @property
    def is_local(self) -> bool:
        return self.local_root is not None

    def path(self, key: str) -> str:
        """The backend's path of `key` (a local path, or bucket/prefix/key)."""
        return f"{self.root}/{key}" if key else self.root

    def location(self, key: str) -> str:
        """`key` as people read it: a local path, or its s3:// URL."""
        return self.path(key) if self.is_local else f"s3://{self.path(key)}"

    # --- reading ------------------------------------------------------------------------------------

    def exists(self, key: str) -> bool:
        return self._retrying(f"look for {key}", lambda: bool(self.fs.exists(self.path(key))))

    def list(self, prefix: str) -> list[StoredFile]:
        """Every file under `prefix`, sorted by path; [] when there is none."""

        def find() -> list[StoredFile]:
            base = self.path(prefix).rstrip("/")
            try:
                found = self.fs.find(base, detail=True)
            except FileNotFoundError:
                return []
            files = []
            for name, info in found.items():
                relative = name[len(base) :].lstrip("/")
                if info.get("type") == "file" and relative:
                    files.append(StoredFile(relative, int(info.get("size") or 0), _modified(info)))
            return sorted(files, key=lambda f: f.path)

        return self._retrying(f"list {prefix}", find)

    def open(self, key: str) -> IO[bytes]:
        """`key`'s bytes to read (ranges on S3: a reader that seeks reads only what it needs)."""
        return self._retrying(f"open {key}", lambda: self.fs.open(self.path(key), "rb"))

    def read(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """`key`'s bytes from `start` to `end` (the end: None), as one request: a range of one version
        of the object, never pieces of two (s3fs's file objects read in several requests and raise
        FileExpired when the object changed between them)."""
        path = self.path(key)

        def read_range() -> bytes:
            try:
                return bytes(self.fs.cat_file(path, start=start, end=end))
            except OSError as exc:
                # S3 refuses a range that starts at the object's end (416, EINVAL here); a local file
                # reads nothing there. A reader that caught up with a log reads nothing new.
                if start > 0 and exc.errno == errno.EINVAL and start >= int(self.fs.size(path)):
                    return b""
                raise

        return self._retrying(f"read {key}", read_range)

    def size(self, key: str) -> int:
        return self._retrying(f"look for {key}", lambda: int(self.fs.size(self.path(key))))

    def get(self, key: str, local: Path) -> None:
        """Download `key` to `local`, whole or not at all (written beside it, then renamed)."""
        local.parent.mkdir(parents=True, exist_ok=True)
        partial = local.with_name(f".{local.name}.{secrets.token_hex(4)}.partial")
        try:
            self._retrying(f"fetch {key}", lambda: self.fs.get_file(self.path(key), str(partial)))
            os.replace(partial, local)
        finally:
            partial.unlink(missing_ok=True)

    # --- writing ------------------------------------------------------------------------------------

    def put(self, local: Path, key: str) -> None:
        """Upload `local` as `key`, whole or not at all: an S3 object appears once its PUT (or
        multipart upload) completes; a local copy is written beside its place and renamed."""
        target = self.path(key)
        if self.is_local:
            if Path(target) == local.resolve():
                return  # the job's folder is the store's: nothing to copy
            partial = f"{target}.{secrets.token_hex(4)}.partial"
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            try:
                self.fs.put_file(str(local), partial)
                crash_point("store_put")  # tests: a process killed in the middle of a write
                os.replace(partial, target)
            finally:
                Path(partial).unlink(missing_ok=True)
            return
        crash_point("store_put")
        tries = 0

        def upload() -> None:
            nonlocal tries
            tries += 1
            self.fs.put_file(str(local), target, chunksize=PART_BYTES, max_concurrency=PARTS_AT_ONCE)

        try:
            self._retrying(f"upload {key}", upload)
        except BaseException:
            self._abort_own(key)
            raise
        if tries > 1:
            self._abort_own(key)

    def copy(self, source: str, key: str) -> None:
        """Copy the object `source` to `key` inside the store, no byte through this process: S3's
        CopyObject (s3fs's copy; a multipart copy past 5 GB); a local store copies beside the place and
        renames, so `key` is whole or absent."""
        if self.is_local:
            target = Path(self.path(key))
            partial = f"{target}.{secrets.token_hex(4)}.partial"
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                self.fs.copy(self.path(source), partial)
                os.replace(partial, target)
            finally:
                Path(partial).unlink(missing_ok=True)
            return
        self._retrying(f"copy {source} to {key}", lambda: self.fs.copy(self.path(source), self.path(key)))

    def _abort_own(self, key: str) -> None:
        """s3fs aborts a multipart upload whose part failed, but its abort is one request, lost when
        the store is away: the cut upload's parts stay in the bucket, unseen and billed. Once a try of
        a put failed, the process aborts the uploads of `key` left open, in one try, if the store
        answers by then; the API's start-up sweep takes the rest. Every open upload of the key, not
        only this process's (S3 says nothing of who began one, and moto not even when): keys are a
        job's files, written by one attempt, or content hashes, where the one upload it could cut is
        a second writer's of the same bytes at the same moment, whose put then fails whole (its
        object is never half-written) and the bytes are there from the first."""
        with contextlib.suppress(Exception):
            self.once(lambda quick: quick.abort_uploads(key))

    def abort_uploads(self, key: str | None = None, *, older_than_s: float | None = None) -> int:
        """Abort the S3 multipart uploads left open under the store's prefix (of `key` alone, when
        named), those begun more than `older_than_s` ago when it is given; how many. A
        multipart upload cut by a kill or an outage is not an object (no listing shows it) but its
        parts stay stored until it is aborted."""
        if self.is_local:
            return 0
        bucket, _, root = self.root.partition("/")
        prefix = f"{root}/{key}" if root and key else (key or root)
        cutoff = datetime.now(UTC) - timedelta(seconds=older_than_s) if older_than_s is not None else None

        def abort() -> int:
            aborted, markers = 0, dict[str, str]()
            while True:
                page = self.fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=prefix, **markers)
                for upload in page.get("Uploads", []):
                    begun = upload["Initiated"].astimezone(UTC)
                    if key is not None and upload["Key"] != prefix:
                        continue
                    if cutoff is not None and begun > cutoff:
                        continue
                    self.fs.call_s3(
                        "abort_multipart_upload",
                        Bucket=bucket,
                        Key=upload["Key"],
                        UploadId=upload["UploadId"],
                    )
                    aborted += 1
                if not page.get("IsTruncated"):
                    break
                markers = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}
            return aborted

        aborted = self._retrying(f"abort the uploads left open under {key or 'the store'}", abort)
        if aborted:
            logger.info("aborted %d multipart upload(s) left open under %s", aborted, key or "the store")
        return aborted

    def delete(self, key: str) -> None:
        """Remove `key`, or everything under it; nothing there is no error."""

        def remove() -> None:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(self.path(key), recursive=True)

        self._retrying(f"delete {key}", remove)

    def signed_url(self, key: str, expires_s: int) -> str | None:
        """A presigned URL that reads `key` for `expires_s` seconds, where the store has them."""
        if self.is_local:
            return None
        return str(self._retrying(f"sign {key}", lambda: self.fs.sign(self.path(key), expiration=expires_s)))

    def check(self) -> None:
        """Make sure the store can be used: its folder or bucket exists (made when missing, as a
        MinIO or a test server starts empty)."""
        bucket = self.root.split("/")[0]

        def ensure() -> None:
            if not self.fs.exists(bucket if not self.is_local else self.root):
                logger.info("creating the store's %s %s", "folder" if self.is_local else "bucket", bucket)
                self.fs.makedirs(bucket if not self.is_local else self.root, exist_ok=True)

        self._retrying("reach the store", ensure)

    # --- retries ------------------------------------------------------------------------------------

    def _retrying(self, what: str, operation: Callable[[], T], *, retry_s: float | None = None) -> T:
        deadline = time.monotonic() + (self.retry_s if retry_s is None else retry_s)
        backoff = Backoff(base_s=0.5, cap_s=10.0)
        logged_at = 0.0
        while True:
            try:
                return operation()
            except Exception as exc:
                if self.is_local or not is_transient(exc):
                    raise
                now = time.monotonic()
                if now >= deadline:
                    # The driver's text names the endpoint, the bucket and the prefix (botocore's
                    # "Could not connect to the endpoint URL: http://…/bucket/prefix/key"): the
                    # operator's log keeps it; the message users read (a 503's, a job's error) names
                    # only what was being done, by key.
                    logger.error(
                        "the file store did not answer for %g s (could not %s); giving up: %s",
                        self.retry_s,
                        what,
                        _first_line(exc),
                    )
                    raise StoreUnavailable(
                        f"the file store did not answer for {self.retry_s:g} s (could not {what})"
                    ) from exc
                if now - logged_at >= OUTAGE_LOG_INTERVAL_S:
                    logger.warning("the file store is unreachable (%s); retrying: %s", what, _first_line(exc))
                    logged_at = now
                time.sleep(min(backoff.next_delay(), max(0.0, deadline - now)))

    def once(self, operation: Callable[[Store], T]) -> T:
        """`operation(store)` with no retry: for best-effort work that must not wait (a log copy
        between heartbeats)."""
        quick = Store(self.fs, self.root, url=self.url, local_root=self.local_root, retry_s=0.0)
        return operation(quick)


def _modified(info: dict[str, Any]) -> datetime:
    value = info.get("LastModified") or info.get("mtime") or info.get("created")
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value, UTC)
    return datetime.fromtimestamp(0, UTC)


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


def open_store(settings: Settings, *, retry_s: float | None = None) -> Store:
    """The store GLUEJOBS_STORAGE_URL names (the local artifacts folder when it is unset); its
    operations are retried for `retry_s` (default GLUEJOBS_STORAGE_RETRY_S)."""
    retry_s = settings.storage_retry_s if retry_s is None else retry_s
    if settings.storage_url is None:
        root = Path(os.path.realpath(settings.artifacts_dir))
        return Store(LocalFileSystem(), str(root), url=str(root), local_root=root, retry_s=retry_s)
    # Imported here: only an S3 deployment needs s3fs (and botocore behind it).
    from s3fs import S3FileSystem

    fs = S3FileSystem(
        # Workers and APIs on other machines change the store: never answer from a stale listing.
        use_listings_cache=False,
        skip_instance_cache=True,
        # Fail fast and let Store._retrying wait: botocore's own retries would hide an outage.
        config_kwargs={"connect_timeout": 5, "read_timeout": 60, "retries": {"max_attempts": 2}},
    )
    return Store(
        fs,
        settings.storage_url.removeprefix("s3://"),
        url=settings.storage_url,
        local_root=None,
        retry_s=retry_s,
    )


def file_key(sha256: str) -> str:
    return f"{FILES}/{sha256}"


def model_blob_key(sha256: str) -> str:
    """One file of a registered model, by the sha256 of its bytes (shared by every model holding it)."""
    return f"{MODELS}/blobs/{sha256}"


def model_manifest_key(sha256: str) -> str:
    """A registered model's manifest (its files' paths and hashes), by its own sha256: the model's hash."""
    return f"{MODELS}/manifests/{sha256}.json"
