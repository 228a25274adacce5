"""`client.owners` and `client.workers`, sync and async: the queue by owner, each owner's share and
quotas (admin keys change them), and the fleet. Each request is built once, below, and sent through
the client's I/O (resources/_transport.py)."""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from gluejobs._core import Call
from gluejobs._types import OwnerInfo, WorkerInfo
from gluejobs.resources._transport import AsyncTransport, SyncTransport

OWNER_FIELDS = ("share", "max_devices", "max_queued", "max_device_hours_per_day", "max_storage_bytes")


def _owners() -> Call:
    return Call("GET", "/v1/owners")


def _owner_update(name: str, quota: Mapping[str, Any]) -> Call:
    """PATCH /v1/owners/{name}: only the fields given (None: back to the configured default)."""
    unknown = set(quota) - set(OWNER_FIELDS)
    if unknown:
        raise TypeError(f"unknown owner setting(s) {sorted(unknown)}; expected {', '.join(OWNER_FIELDS)}")
    return Call("PATCH", f"/v1/owners/{quote(name, safe='')}", json=dict(quota))


def _workers() -> Call:
    return Call("GET", "/v1/workers")


class Owners:
    """`client.owners`: the queue by owner, and (admin keys) each owner's share and quotas."""

    def __init__(self, client: SyncTransport) -> None:
        self._c = client

    def list(self) -> builtins.list[OwnerInfo]:
        return self._c._all(_owners(), OwnerInfo)

    def update(self, name: str, **quota: Any) -> OwnerInfo:
        return self._c._one(_owner_update(name, quota), OwnerInfo)


class AsyncOwners:
    """`client.owners` of AsyncClient: Owners' methods, awaited."""

    def __init__(self, client: AsyncTransport) -> None:
        self._c = client

    async def list(self) -> builtins.list[OwnerInfo]:
        return await self._c._all(_owners(), OwnerInfo)

    async def update(self, name: str, **quota: Any) -> OwnerInfo:
        return await self._c._one(_owner_update(name, quota), OwnerInfo)


class Workers:
    """`client.workers`: the fleet, each worker with what it runs."""

    def __init__(self, client: SyncTransport) -> None:
        self._c = client

    def list(self) -> builtins.list[WorkerInfo]:
        return self._c._all(_workers(), WorkerInfo)


class AsyncWorkers:
    """`client.workers` of AsyncClient."""

    def __init__(self, client: AsyncTransport) -> None:
        self._c = client

    async def list(self) -> builtins.list[WorkerInfo]:
        return await self._c._all(_workers(), WorkerInfo)
