"""Downloads from the store, for the routes that serve stored files (artifacts, uploaded files)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO
from urllib.parse import quote as url_quote

from fastapi import Response, status
from fastapi.responses import FileResponse, RedirectResponse, StreamingResponse

from service.files.job_folders import JobFolder, job_folder
from shared.core.config import Settings
from shared.core.storage import Store
from shared.wire.job_folder import job_key

CHUNK_BYTES = 1 << 20


def folder_of(settings: Settings, store: Store, job_id: int) -> JobFolder:
    """A job's folder, from wherever the store keeps it."""
    return job_folder(store, settings.job_dir(job_id), job_key(job_id))


def stored_download(store: Store, settings: Settings, key: str, filename: str) -> Response:
    """One stored file as a download: read from the local folder, streamed from the object store, or
    a redirect to a presigned URL of it (GLUEJOBS_STORAGE_PRESIGN_S)."""
    if store.local_root is not None:
        return FileResponse(store.path(key), filename=filename)
    if settings.storage_presign_s:
        url = store.signed_url(key, settings.storage_presign_s)
        if url is not None:
            return RedirectResponse(url, status_code=status.HTTP_307_TEMPORARY_REDIRECT)
    handle = store.open(key)
    return StreamingResponse(
        _chunks(handle),
        media_type="application/octet-stream",
        headers={"Content-Disposition": f"attachment; filename*=utf-8''{url_quote(filename)}"},
    )


def _chunks(handle: IO[bytes]) -> Iterator[bytes]:
    with handle:
        while chunk := handle.read(CHUNK_BYTES):
            yield chunk
