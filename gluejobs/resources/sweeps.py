"""`client.sweeps`, sync and async: one job per combination of seeds and grid values, and statistics
over seeds. Each request is built once, below, and sent through the client's I/O
(resources/_transport.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any, TypedDict, Unpack

from gluejobs._core import Call
from gluejobs._types import Sweep, SweepPlan
from gluejobs.resources._transport import AsyncTransport, SyncTransport


class SweepOptions(TypedDict, total=False):
    """`sweeps.create`'s options beside the spec."""

    seeds: Sequence[int]
    grid: Mapping[str, Sequence[Any]]
    priority: int
    metadata: Mapping[str, str]
    max_attempts: int


def _create(spec: Mapping[str, Any], options: SweepOptions, *, dry_run: bool = False) -> Call:
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


def _list(page_size: int) -> Call:
    return Call("GET", "/v1/sweeps", params={"limit": page_size})


def _get(sweep_id: int) -> Call:
    return Call("GET", f"/v1/sweeps/{sweep_id}")


def _cancel(sweep_id: int) -> Call:
    return Call("POST", f"/v1/sweeps/{sweep_id}/cancel", idempotent=False)


class Sweeps:
    """`client.sweeps`: one job per combination of seeds and grid values, and statistics over seeds."""

    def __init__(self, client: SyncTransport) -> None:
        self._c = client

    def create(self, spec: Mapping[str, Any], **options: Unpack[SweepOptions]) -> Sweep:
        """Queue the sweep (`seeds=[0, 1, 2]`, `grid={"learning_rate": [1e-4, 5e-4]}`); not sent again
        after a failure that may have reached the server."""
        return self._c._one(_create(spec, options), Sweep)

    def dry_run(self, spec: Mapping[str, Any], **options: Unpack[SweepOptions]) -> SweepPlan:
        """Every combination checked and resolved, storing nothing."""
        return self._c._one(_create(spec, options, dry_run=True), SweepPlan)

    def get(self, sweep_id: int) -> Sweep:
        """The sweep with its per-configuration statistics and winner."""
        return self._c._one(_get(sweep_id), Sweep)

    def list(self, *, page_size: int = 100) -> Iterator[Sweep]:
        return self._c._paginate(_list(page_size), Sweep.from_json)

    def cancel(self, sweep_id: int) -> Sweep:
        return self._c._one(_cancel(sweep_id), Sweep)


class AsyncSweeps:
    """`client.sweeps` of AsyncClient: Sweeps' methods, awaited."""

    def __init__(self, client: AsyncTransport) -> None:
        self._c = client

    async def create(self, spec: Mapping[str, Any], **options: Unpack[SweepOptions]) -> Sweep:
        return await self._c._one(_create(spec, options), Sweep)

    async def dry_run(self, spec: Mapping[str, Any], **options: Unpack[SweepOptions]) -> SweepPlan:
        return await self._c._one(_create(spec, options, dry_run=True), SweepPlan)

    async def get(self, sweep_id: int) -> Sweep:
        return await self._c._one(_get(sweep_id), Sweep)

    def list(self, *, page_size: int = 100) -> AsyncIterator[Sweep]:
        return self._c._paginate(_list(page_size), Sweep.from_json)

    async def cancel(self, sweep_id: int) -> Sweep:
        return await self._c._one(_cancel(sweep_id), Sweep)
