"""`client.models`, sync and async: model folders registered once, named in a spec as `model:NAME`.
Each request is built once, below, and sent through the client's I/O (resources/_transport.py);
packing the local folder is gluejobs/_models.py's."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import quote

from gluejobs._core import Call, query
from gluejobs._files import UPLOAD_TIMEOUT
from gluejobs._models import packed_folder
from gluejobs._types import ModelInfo
from gluejobs.resources._transport import AsyncTransport, Destination, SyncTransport


def _upload(tar_path: Path, name: str) -> Call:
    # Not idempotent: a retry after the API stored the model would answer 409 (the name is taken).
    return Call(
        "POST", "/v1/models", upload=tar_path, form={"name": name}, timeout=UPLOAD_TIMEOUT, idempotent=False
    )


def _promote(job_id: int, name: str, checkpoint: str | int | None) -> Call:
    """POST /v1/jobs/{id}/model: the job's model (or a checkpoint: `checkpoint-300`, 300, `best`)
    registered as `model:NAME`; the store copies its files, nothing is sent but the names."""
    body = {"name": name, "checkpoint": None if checkpoint is None else str(checkpoint)}
    # Not idempotent: a retry after the API registered it would answer 409 (the name is taken).
    return Call("POST", f"/v1/jobs/{int(job_id)}/model", json=body, idempotent=False)


def _list(page_size: int) -> Call:
    return Call("GET", "/v1/models", params=query(limit=page_size))


def _one_of(name: str, owner: str | None, method: str = "GET") -> Call:
    """GET or DELETE /v1/models/{name} (`owner`: an admin's look at another owner's model)."""
    return Call(method, f"/v1/models/{quote(name, safe='')}", query(owner=owner) or None)


class Models:
    """`client.models`: model folders registered once, named in a spec as `model:NAME`."""

    def __init__(self, client: SyncTransport) -> None:
        self._c = client

    def upload(self, folder: Destination, *, name: str) -> ModelInfo:
        """Register a local model folder under `name` (packed as a tar and sent whole; checked as it
        lands: ApiError 422 naming the problem, 409 when you have a model of that name)."""
        with packed_folder(folder) as tar_path:
            return self._c._one(_upload(tar_path, name), ModelInfo)

    def promote(self, job_id: int, *, name: str, checkpoint: str | int | None = None) -> ModelInfo:
        """Register job `job_id`'s final model (or `checkpoint`: one it declared, `checkpoint-300` or
        300, or `best`) as your model `name`, without moving its bytes: the API's store copies them.
        ApiError 404 for a job you cannot see, 409 when the name is taken or the job has not
        succeeded, 422 for a checkpoint it did not declare or a LoRA job's adapter."""
        return self._c._one(_promote(job_id, name, checkpoint), ModelInfo)

    def list(self, *, page_size: int = 100) -> Iterator[ModelInfo]:
        return self._c._paginate(_list(page_size), ModelInfo.from_json)

    def get(self, name: str, *, owner: str | None = None) -> ModelInfo:
        """One model (`owner`: admins, another owner's)."""
        return self._c._one(_one_of(name, owner), ModelInfo)

    def delete(self, name: str, *, owner: str | None = None) -> None:
        """Delete the model (409 while a queued or running job uses it)."""
        self._c._send(_one_of(name, owner, "DELETE"))


class AsyncModels:
    """`client.models` of AsyncClient: Models' methods, awaited."""

    def __init__(self, client: AsyncTransport) -> None:
        self._c = client

    async def upload(self, folder: Destination, *, name: str) -> ModelInfo:
        with packed_folder(folder) as tar_path:
            return await self._c._one(_upload(tar_path, name), ModelInfo)

    async def promote(self, job_id: int, *, name: str, checkpoint: str | int | None = None) -> ModelInfo:
        return await self._c._one(_promote(job_id, name, checkpoint), ModelInfo)

    def list(self, *, page_size: int = 100) -> AsyncIterator[ModelInfo]:
        return self._c._paginate(_list(page_size), ModelInfo.from_json)

    async def get(self, name: str, *, owner: str | None = None) -> ModelInfo:
        return await self._c._one(_one_of(name, owner), ModelInfo)

    async def delete(self, name: str, *, owner: str | None = None) -> None:
        await self._c._send(_one_of(name, owner, "DELETE"))
