"""What every resource uses of the client that sends its requests: client.Client's and
client.AsyncClient's I/O methods, named once here so that no resource module imports client.py
(which imports them all) and none redeclares them.

A resource method describes its request as a `Call` (gluejobs/_core.py) and hands it to one of
these: `_one` (one result), `_all` (a list in one answer), `_paginate` (page after page), `_send`
(the raw answer, or a download `into` a file), `_stream` (a job's live events).
"""

from __future__ import annotations

import builtins
import os
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Protocol, TypeVar

from gluejobs._core import Answer, Call
from gluejobs._download import Receiver
from gluejobs._types import Result, StreamEvent

R = TypeVar("R", bound=Result)
T = TypeVar("T")
# A local path a method writes to or reads from (a download's folder, an upload's file).
Destination = str | os.PathLike[str]


class SyncTransport(Protocol):
    """What the resources use of client.Client."""

    def _send(self, call: Call, into: Receiver | None = None) -> Answer: ...
    def _one(self, call: Call, kind: type[R]) -> R: ...
    def _all(self, call: Call, kind: type[R]) -> builtins.list[R]: ...
    def _paginate(self, call: Call, item: Callable[[Any], T]) -> Iterator[T]: ...
    def _stream(self, call: Call, last_event_id: str | None) -> Iterator[StreamEvent]: ...


class AsyncTransport(Protocol):
    """What the resources use of client.AsyncClient: the same methods, awaited (the iterators are
    async ones, made without awaiting)."""

    async def _send(self, call: Call, into: Receiver | None = None) -> Answer: ...
    async def _one(self, call: Call, kind: type[R]) -> R: ...
    async def _all(self, call: Call, kind: type[R]) -> builtins.list[R]: ...
    def _paginate(self, call: Call, item: Callable[[Any], T]) -> AsyncIterator[T]: ...
    def _stream(self, call: Call, last_event_id: str | None) -> AsyncIterator[StreamEvent]: ...
