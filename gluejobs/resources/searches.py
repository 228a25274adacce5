"""`client.searches`, sync and async: hyperparameter searches, each request built once, below, and
sent through the client's I/O (resources/_transport.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any, TypedDict, Unpack

from gluejobs._core import Call
from gluejobs._types import Search
from gluejobs.resources._transport import AsyncTransport, SyncTransport


class SearchOptions(TypedDict, total=False):
    """`searches.create`'s options beside the spec and the space (POST /v1/searches's fields)."""

    objective: Mapping[str, Any]  # {"metric": "accuracy", "direction": "maximize"}
    n_trials: int
    parallelism: int
    sampler: Mapping[str, Any]  # {"type": "tpe"} or {"type": "random"}
    pruner: Mapping[str, Any]  # {"type": "median"}, {"type": "asha", "reduction_factor": 2}, {"type": "none"}
    priority: int
    metadata: Mapping[str, str]
    max_attempts: int


def _create(spec: Mapping[str, Any], space: Mapping[str, Any], options: SearchOptions) -> Call:
    body = {"spec": dict(spec), "space": dict(space), **{k: v for k, v in options.items() if v is not None}}
    # Not sent again after a failure that may have reached the server: it would start a second search.
    return Call("POST", "/v1/searches", json=body, idempotent=False)


def _list(page_size: int) -> Call:
    return Call("GET", "/v1/searches", params={"limit": page_size})


def _get(search_id: int) -> Call:
    return Call("GET", f"/v1/searches/{search_id}")


def _cancel(search_id: int) -> Call:
    return Call("POST", f"/v1/searches/{search_id}/cancel", idempotent=False)


def _seeds(search_id: int, seeds: Sequence[int]) -> Call:
    return Call("POST", f"/v1/searches/{search_id}/seeds", json={"seeds": list(seeds)}, idempotent=False)


class Searches:
    """`client.searches`: hyperparameter searches whose trials are jobs, pruned early by the service."""

    def __init__(self, client: SyncTransport) -> None:
        self._c = client

    def create(
        self, spec: Mapping[str, Any], space: Mapping[str, Any], **options: Unpack[SearchOptions]
    ) -> Search:
        """Start a search, e.g. `space={"learning_rate": {"type": "float", "low": 1e-5, "high": 1e-3,
        "log": True}}`; not sent again after a failure that may have reached the server."""
        return self._c._one(_create(spec, space, options), Search)

    def get(self, search_id: int) -> Search:
        """The search with its best trial and its trials table."""
        return self._c._one(_get(search_id), Search)

    def list(self, *, page_size: int = 100) -> Iterator[Search]:
        return self._c._paginate(_list(page_size), Search.from_json)

    def cancel(self, search_id: int) -> Search:
        return self._c._one(_cancel(search_id), Search)

    def rerun_best(self, search_id: int, seeds: Sequence[int]) -> Search:
        """Re-run the best trial once per seed; `get` then reports their median under `seeds`."""
        return self._c._one(_seeds(search_id, seeds), Search)


class AsyncSearches:
    """`client.searches` of AsyncClient: Searches' methods, awaited."""

    def __init__(self, client: AsyncTransport) -> None:
        self._c = client

    async def create(
        self, spec: Mapping[str, Any], space: Mapping[str, Any], **options: Unpack[SearchOptions]
    ) -> Search:
        return await self._c._one(_create(spec, space, options), Search)

    async def get(self, search_id: int) -> Search:
        return await self._c._one(_get(search_id), Search)

    def list(self, *, page_size: int = 100) -> AsyncIterator[Search]:
        return self._c._paginate(_list(page_size), Search.from_json)

    async def cancel(self, search_id: int) -> Search:
        return await self._c._one(_cancel(search_id), Search)

    async def rerun_best(self, search_id: int, seeds: Sequence[int]) -> Search:
        return await self._c._one(_seeds(search_id, seeds), Search)
