"""The request guard: what must be refused before a route runs, and before any of the body is read.

A pure ASGI middleware, so it sees each request before Starlette reads a byte of its body:

- a Host header that does not name this API gets 400, and a state-changing request that a web page
  on another origin sent gets 403 (service/edge/origins.py: DNS rebinding, cross-site requests);
- a /v1 request without a valid key gets 401 at once, so an anonymous 100 MiB upload costs the API
  nothing but the headers; the caller found here (service/accounts/auth.py) is what routes see
  (`request.state.principal`), and a read-only key's state-changing request gets 403;
- a key over its rate limit gets 429 with Retry-After (service/edge/rate_limits.py: counted in the
  database, in the same thread call as the key's lookup; the health routes are outside /v1);
  /metrics is admitted and counted as a /v1 read is; a key the key cache knows and a read counted
  in memory are admitted on the event loop, without a thread;
- a body is capped by the bytes actually received, not by trusting Content-Length: a declared
  length over the cap gets 413 at once, and a body that grows past it while it is read (chunked
  uploads have no Content-Length) stops being read and gets 413;
- a body must have arrived whole within GLUEJOBS_BODY_TIMEOUT_S of the app's first read of it, or
  the request gets 408 and its connection is closed: a client sending a byte a second cannot hold
  a connection (the time to send the request head is bounded in service/edge/connections.py).
- an upload (POST /v1/files) may be up to GLUEJOBS_MAX_UPLOAD_BYTES, and its time grows with what
  has arrived: GLUEJOBS_BODY_TIMEOUT_S plus a second per MIN_UPLOAD_BYTES_PER_S received, so a
  real upload over a slow link finishes and a trickle does not hold a connection.

Why not Starlette's RequestBodyLimitMiddleware (FastAPI's `max_body_size`)? It counts received bytes
too, but when Content-Length is over the limit it replaces whatever response the app sends, the 401
above included, with a plain-text 413 instead of the API's error body; and as the app-wide limit it
sits outside every user middleware, so this guard could not answer first. An early answer to a
request whose declared body is small (REFUSED_BODY_READ_BYTES, read within GLUEJOBS_BODY_TIMEOUT_S)
reads that body first and keeps the connection: closing a socket with unread bytes in it makes the
kernel reset the connection, and a client still sending its body could then lose the answer itself
(a read-only key's 403 came back as "connection reset"). Any other early answer closes the
connection, so the server does not go on reading a body nobody will use.
"""

from __future__ import annotations

import anyio
from sqlalchemy.exc import SQLAlchemyError
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.accounts.auth import KeyRing, Principal
from service.edge.origins import SAFE_METHODS, HostRules
from service.edge.outage import DATABASE_UNAVAILABLE, RETRY_AFTER_S, UNAVAILABLE_MESSAGE
from service.edge.rate_limits import RateLimits
from service.errors import error_response
from shared.core.db_retries import is_transient
from shared.core.errors import Forbidden, RateLimited, Unauthorized

PROTECTED_PREFIX = "/v1"
# Outside /v1 (Prometheus scrapes it where it expects it) but guarded as /v1 is: a key, its rate limit.
METRICS_PATH = "/metrics"
UPLOAD_PATH = "/v1/files"
MODEL_UPLOAD_PATH = "/v1/models"  # a model folder's tar, up to GLUEJOBS_MAX_MODEL_BYTES
# The multipart framing around an upload's file: its headers and small form fields.
UPLOAD_FRAMING_BYTES = 64 * 1024
MIN_UPLOAD_BYTES_PER_S = 64 * 1024
# A refused request's body up to this size (declared by Content-Length) is read before the answer, so
# the answer arrives and the connection stays open; a larger or chunked one's connection is closed.
REFUSED_BODY_READ_BYTES = 64 * 1024


def too_large_message(max_body_bytes: int) -> str:
    return f"the request body is larger than {max_body_bytes} bytes"


class RequestGuard:
    def __init__(
        self,
        app: ASGIApp,
        *,
        keys: KeyRing,
        hosts: HostRules,
        max_body_bytes: int,
        body_timeout_s: float,
        max_upload_bytes: int,
        max_model_bytes: int | None = None,
        limits: RateLimits | None = None,
    ) -> None:
        self.app = app
        self.keys = keys
        self.hosts = hosts
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.max_upload_bytes = max_upload_bytes
        self.max_model_bytes = max_model_bytes if max_model_bytes is not None else max_upload_bytes
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = _no_sniffing(send)
        headers = Headers(scope=scope)
        host = headers.get("host")
        if not self.hosts.allows_host(host):
            message = "the Host header does not name this API (add the name to GLUEJOBS_ALLOWED_HOSTS)"
            await self._refuse(400, "invalid_host", message, scope, receive, send)
            return
        origin = headers.get("origin")
        if scope["method"] not in SAFE_METHODS and (
            (origin is not None and not self.hosts.allows_origin(origin, host))
            or (origin is None and headers.get("sec-fetch-site") == "cross-site")
        ):
            message = "a web page on another origin may not change anything here (GLUEJOBS_ALLOWED_ORIGINS)"
            await self._refuse(403, "forbidden_origin", message, scope, receive, send)
            return
        path: str = scope["path"]
        if path in (PROTECTED_PREFIX, METRICS_PATH) or path.startswith(f"{PROTECTED_PREFIX}/"):
            try:
                # A key known without the database and a read counted in memory need no thread;
                # a stored key's lookup and an exact count do: in a thread, as a sync route's.
                principal = self._admit_without_waiting(headers.get("authorization"), scope["method"])
                if principal is None:
                    principal = await anyio.to_thread.run_sync(
                        self._admit, headers.get("authorization"), scope["method"]
                    )
            except (Unauthorized, Forbidden, RateLimited) as exc:
                retry = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, RateLimited) else None
                await self._refuse(exc.status_code, exc.code, exc.message, scope, receive, send, retry)
                return
            except SQLAlchemyError as exc:
                if not is_transient(exc):
                    raise
                headers_503 = {"Retry-After": str(RETRY_AFTER_S)}
                await self._refuse(
                    503, DATABASE_UNAVAILABLE, UNAVAILABLE_MESSAGE, scope, receive, send, headers_503
                )
                return
            scope.setdefault("state", {})["principal"] = principal
        uploads = {UPLOAD_PATH: self.max_upload_bytes, MODEL_UPLOAD_PATH: self.max_model_bytes}
        upload_bytes = uploads.get(path) if scope["method"] == "POST" else None
        upload = upload_bytes is not None
        limit = upload_bytes + UPLOAD_FRAMING_BYTES if upload_bytes is not None else self.max_body_bytes
        declared = headers.get("content-length")
        if declared is not None:
            if not (declared.isascii() and declared.isdigit()):
                await self._refuse(400, "bad_request", "Content-Length is not a number", scope, receive, send)
                return
            if int(declared) > limit:
                message = too_large_message(limit)
                await self._refuse(413, "request_too_large", message, scope, receive, send)
                return
        await self.app(scope, self._capped(receive, limit, upload=upload), send)

    def _admit_without_waiting(self, authorization: str | None, method: str) -> Principal | None:
        """_admit's answer when it needs no database (service/accounts/auth.py's key cache, a read counted in
        memory: service/edge/rate_limits.py); None: call _admit in a thread."""
        principal = self.keys.principal_without_waiting(authorization)
        if principal is None:
            return None
        write = method not in SAFE_METHODS
        if write and not principal.can_write:
            raise Forbidden("this key is read-only: it reads its owner's jobs but changes nothing")
        if (
            self.limits is not None
            and principal.bucket
            and not self.limits.count_without_waiting(principal.bucket, write=write)
        ):
            return None
        return principal

    def _admit(self, authorization: str | None, method: str) -> Principal:
        """The caller, once its key is valid, allowed this method, and within its rate limit (the
        request counted: service/edge/rate_limits.py); without auth (no bucket) nothing is counted."""
        principal = self.keys.principal(authorization)
        write = method not in SAFE_METHODS
        if write and not principal.can_write:
            raise Forbidden("this key is read-only: it reads its owner's jobs but changes nothing")
        if self.limits is not None and principal.bucket:
            self.limits.count(principal.bucket, write=write)
        return principal

    def _capped(self, receive: Receive, limit: int, *, upload: bool) -> Receive:
        received = 0
        started: float | None = None  # the app's first read of the body
        whole = False

        async def capped_receive() -> Message:
            nonlocal received, started, whole
            if whole:
                return await receive()  # after the body: http.disconnect, awaited by streams for hours
            if started is None:
                started = anyio.current_time()
            allowed_s = self.body_timeout_s + (received / MIN_UPLOAD_BYTES_PER_S if upload else 0.0)
            message: Message | None = None
            with anyio.move_on_after(started + allowed_s - anyio.current_time()):
                message = await receive()
            if message is None:
                raise HTTPException(
                    408,
                    f"the request body did not arrive within {allowed_s:g} s",
                    headers={"Connection": "close"},
                )
            if message["type"] != "http.request" or not message.get("more_body", False):
                whole = True
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # An HTTPException: FastAPI's body reader lets it through (any other error would
                    # become a 400), and the app's handler renders it in the API's error body.
                    raise HTTPException(413, too_large_message(limit), headers={"Connection": "close"})
            return message

        return capped_receive

    async def _refuse(
        self,
        status: int,
        code: str,
        message: str,
        scope: Scope,
        receive: Receive,
        send: Send,
        headers: dict[str, str] | None = None,
    ) -> None:
        response = error_response(status, code, message, headers=headers)
        if status == 413 or not await self._read_small_body(scope, receive):
            response.headers["Connection"] = "close"
        await response(scope, receive, send)

    async def _read_small_body(self, scope: Scope, receive: Receive) -> bool:
        """True once a refused request's whole body has been read: none, or a declared length of at
        most REFUSED_BODY_READ_BYTES that arrived within the body timeout."""
        headers = Headers(scope=scope)
        declared = headers.get("content-length")
        if declared is None:
            return "transfer-encoding" not in headers
        if not (declared.isascii() and declared.isdigit()) or int(declared) > REFUSED_BODY_READ_BYTES:
            return False
        received = 0
        with anyio.move_on_after(self.body_timeout_s):
            while received <= REFUSED_BODY_READ_BYTES:
                message = await receive()
                if message["type"] != "http.request":
                    return False
                received += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return received <= REFUSED_BODY_READ_BYTES
        return False


def _no_sniffing(send: Send) -> Send:
    """Every answer says its Content-Type is to be believed: an artifact served as text or JSON is
    never run as HTML or a script by a browser that guesses."""

    async def send_with_header(message: Message) -> None:
        if message["type"] == "http.response.start":
            MutableHeaders(scope=message).setdefault("X-Content-Type-Options", "nosniff")
        await send(message)

    return send_with_header
