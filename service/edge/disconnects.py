"""A client that goes away in the middle of its answer is normal behaviour, not an error (issue 34
item 5): a browser tab closed on a job's stream, a client killed mid-replay, a probe that gave up.

What it looked like before: FastAPI's SSE support (fastapi.sse) runs a stream's producer in a task
group that it closes after the response; when the client hung up mid-replay, its forwarding task
wrote into a stream already closed, and the task group raised an ExceptionGroup of anyio's
BrokenResourceError/ClosedResourceError. That reached the error handler (an ERROR line) and then
uvicorn (a second ERROR, with a traceback): 14 of 30 such disconnects logged both. A response written
to a socket the peer closed raises BrokenPipeError or ConnectionResetError the same way.

This middleware sits under Starlette's ServerErrorMiddleware (outside every route): an exception
raised after the response started whose every part says "the other end is gone" is swallowed, with a
DEBUG line; uvicorn's access line (INFO) stays the one line the request leaves. Anything else
(a real bug, or a failure before the answer began, which still owes the client a 500) propagates.
"""

from __future__ import annotations

import logging

from anyio import BrokenResourceError, ClosedResourceError
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)

# BrokenPipeError and ConnectionResetError are ConnectionErrors; uvicorn's ClientDisconnected is an
# OSError of its own, named here so that the module imports without uvicorn (tests' TestClient).
_GONE = (ConnectionError, BrokenResourceError, ClosedResourceError, ClientDisconnect)
_GONE_NAMES = frozenset({"ClientDisconnected"})


def is_client_gone(exc: BaseException) -> bool:
    """Whether `exc` (every exception of a group, at any depth) says only that the client went away."""
    if isinstance(exc, BaseExceptionGroup):
        return all(is_client_gone(inner) for inner in exc.exceptions)
    return isinstance(exc, _GONE) or type(exc).__name__ in _GONE_NAMES


class QuietDisconnects:
    """Pure ASGI middleware: a client's disconnect after its response started is not an error."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except BaseException as exc:
            if not (started and is_client_gone(exc)):
                raise
            logger.debug("the client closed %s %s before its answer ended", scope["method"], scope["path"])
