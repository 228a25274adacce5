"""`client.files`, sync and async: uploaded data files. Each request is built once, below, and sent
through the client's I/O (resources/_transport.py); reading and hashing the local file, and whether
an uploaded one can be reused, are gluejobs/_files.py's."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

from gluejobs._core import Call, query
from gluejobs._download import new_file
from gluejobs._files import UPLOAD_TIMEOUT, LocalFile, given_columns
from gluejobs._types import FileInfo
from gluejobs.resources._transport import AsyncTransport, Destination, SyncTransport


def _upload(
    local: LocalFile,
    *,
    purpose: str,
    task_name: str | None,
    columns: Mapping[str, str] | None,
    dry_run: bool = False,
) -> Call:
    # Idempotent: the API answers the same bytes sent again by the same caller with the same file.
    return Call(
        "POST",
        "/v1/files",
        params=query(dry_run="true" if dry_run else None),
        upload=local.path,
        form=query(purpose=purpose, task_name=task_name, **given_columns(columns)),
        timeout=UPLOAD_TIMEOUT,
    )


def _list(sha256: str | None, page_size: int) -> Call:
    return Call("GET", "/v1/files", params=query(sha256=sha256, limit=page_size))


def _get(file_id: str) -> Call:
    return Call("GET", f"/v1/files/{file_id}")


def _delete(file_id: str) -> Call:
    return Call("DELETE", f"/v1/files/{file_id}")


def _content(file_id: str) -> Call:
    return Call("GET", f"/v1/files/{file_id}/content")


class Files:
    """`client.files`: uploaded data files."""

    def __init__(self, client: SyncTransport) -> None:
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
        call = _upload(local, purpose=purpose, task_name=task_name, columns=columns)
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
        local = LocalFile.read(path)
        return self._c._send(
            _upload(local, purpose=purpose, task_name=task_name, columns=columns, dry_run=True)
        ).json()

    def list(self, *, sha256: str | None = None, page_size: int = 100) -> Iterator[FileInfo]:
        return self._c._paginate(_list(sha256, page_size), FileInfo.from_json)

    def get(self, file_id: str) -> FileInfo:
        return self._c._one(_get(file_id), FileInfo)

    def delete(self, file_id: str) -> None:
        """Delete the file (409 while a queued or running job uses it)."""
        self._c._send(_delete(file_id))

    def download(self, file_id: str, dest: Destination) -> Path:
        """The file's bytes into the file `dest` (written whole, or not at all)."""
        target = Path(dest)
        self._c._send(_content(file_id), into=lambda _h: new_file(target))
        return target


class AsyncFiles:
    """`client.files` of AsyncClient: Files' methods, awaited."""

    def __init__(self, client: AsyncTransport) -> None:
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
        call = _upload(local, purpose=purpose, task_name=task_name, columns=columns)
        return existing or await self._c._one(call, FileInfo)

    async def check(
        self,
        path: Destination,
        *,
        purpose: str = "train",
        task_name: str | None = None,
        columns: Mapping[str, str] | None = None,
    ) -> Any:
        local = LocalFile.read(path)
        answer = await self._c._send(
            _upload(local, purpose=purpose, task_name=task_name, columns=columns, dry_run=True)
        )
        return answer.json()

    def list(self, *, sha256: str | None = None, page_size: int = 100) -> AsyncIterator[FileInfo]:
        return self._c._paginate(_list(sha256, page_size), FileInfo.from_json)

    async def get(self, file_id: str) -> FileInfo:
        return await self._c._one(_get(file_id), FileInfo)

    async def delete(self, file_id: str) -> None:
        await self._c._send(_delete(file_id))

    async def download(self, file_id: str, dest: Destination) -> Path:
        target = Path(dest)
        await self._c._send(_content(file_id), into=lambda _h: new_file(target))
        return target
