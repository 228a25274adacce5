"""The webhook dispatcher: a background task of each API process that sends the deliveries that are
due (shared/webhooks/deliveries.py) and records every attempt.

It never blocks request handling: the database calls run in worker threads and the requests go out
through one httpx AsyncClient. No receiver can hold up another's deliveries:
- each attempt has one overall deadline, GLUEJOBS_WEBHOOK_TIMEOUT_S, over resolving, connecting,
  sending, the answer's headers and its first bytes (httpx's own timeouts are per read: a receiver
  dripping a byte every few seconds kept one attempt alive for minutes);
- every attempt is a task of its own, and a slot freed by one that ends is filled at once: nothing
  waits for a round of attempts to finish;
- the claim leases at most GLUEJOBS_WEBHOOK_ENDPOINT_CONCURRENCY deliveries of one endpoint and
  GLUEJOBS_WEBHOOK_OWNER_CONCURRENCY of one owner at once, across every API process, and this
  process sends at most GLUEJOBS_WEBHOOK_CONCURRENCY at once.
Each attempt resolves the endpoint's host, checks every address (shared/webhooks/addresses.py) and
connects to the checked address itself (the Host header and TLS name stay the URL's), so a name that
resolves elsewhere a moment later reaches nothing it should not. Redirects are never followed: a
3xx is a failed attempt. Only the first bytes of an answer are read.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import socket
import time
from collections.abc import AsyncIterator
from datetime import datetime

import anyio
import httpx
from sqlalchemy.exc import SQLAlchemyError

from shared.core.config import Settings
from shared.core.db import Database
from shared.core.tables import utcnow
from shared.webhooks.addresses import AllowList, RefusedTarget, Target, addresses_of, check_addresses
from shared.webhooks.deliveries import Backoff, Due, claim_due, record_attempt, release
from shared.webhooks.signing import signed_headers

logger = logging.getLogger(__name__)

# An answer's first bytes are read (and dropped): a small answer's whole, never a flood. The status
# line decides the outcome; the body is read only so that a short answer ends cleanly.
MAX_ANSWER_BYTES = 4 * 1024
# After a database error the loop waits this long before it asks again.
ERROR_PAUSE_S = 5.0
USER_AGENT = "gluejobs-webhooks/1"


class Dispatcher:
    def __init__(self, settings: Settings, db: Database) -> None:
        self.db = db
        self.allow = AllowList.parse(settings.webhook_allowed_hosts)
        self.timeout_s = settings.webhook_timeout_s
        self.poll_s = settings.webhook_poll_s
        self.concurrency = settings.webhook_concurrency
        self.per_endpoint = settings.webhook_endpoint_concurrency
        self.per_owner = settings.webhook_owner_concurrency
        # A claimed delivery is another process's to take only well after its attempt must have ended
        # (the attempt's deadline, then the database write of its outcome).
        self.lease_s = 2 * settings.webhook_timeout_s + 30.0
        self.backoff = Backoff(
            max_attempts=settings.webhook_max_attempts,
            base_s=settings.webhook_backoff_s,
            cap_s=settings.webhook_backoff_max_s,
        )
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._attempts: set[asyncio.Task[None]] = set()

    def wake(self) -> None:
        """Look for due deliveries now (a test-send was queued); callable from any thread."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    async def run(self) -> None:
        """Claim and send until cancelled; then the attempts in flight are cancelled and their
        deliveries handed back."""
        self._loop = asyncio.get_running_loop()
        # trust_env=False: no proxy from the environment, which would connect to the host by name.
        # httpx's timeout is a backstop per operation; the attempt's deadline is _send's.
        async with httpx.AsyncClient(
            timeout=self.timeout_s,
            follow_redirects=False,
            trust_env=False,
            limits=httpx.Limits(max_connections=self.concurrency),
        ) as client:
            try:
                await self._loop_claims(client)
            finally:
                for task in self._attempts:
                    task.cancel()
                await asyncio.gather(*self._attempts, return_exceptions=True)

    async def _loop_claims(self, client: httpx.AsyncClient) -> None:
        while True:
            # Cleared before the claim: an attempt that ends during it sets it again.
            self._wake.clear()
            free = self.concurrency - len(self._attempts)
            if free > 0:
                try:
                    claimed = await anyio.to_thread.run_sync(self._claim, free)
                except SQLAlchemyError as exc:
                    logger.warning(
                        "webhook dispatcher: the database is away (%s); trying again", type(exc).__name__
                    )
                    await asyncio.sleep(ERROR_PAUSE_S)
                    continue
                except Exception:  # a bug must not stop deliveries for good: a claimed one is retried
                    logger.exception("webhook dispatcher: a claim failed; trying again")
                    await asyncio.sleep(ERROR_PAUSE_S)
                    continue
                for due in claimed:
                    task = asyncio.create_task(self._attempt(client, due))
                    self._attempts.add(task)
                    task.add_done_callback(self._ended)
                if len(claimed) == free:
                    continue  # every slot filled: more may be due, once a slot frees
            # Wait for a free slot, a test-send, or the next poll.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.poll_s)

    def _ended(self, task: asyncio.Task[None]) -> None:
        # A slot is free, and the endpoint's and owner's leases may have room again: claim now.
        self._attempts.discard(task)
        self._wake.set()

    def _claim(self, limit: int) -> list[Due]:
        with self.db.session() as session:
            return claim_due(
                session,
                limit=limit,
                lease_s=self.lease_s,
                per_endpoint=self.per_endpoint,
                per_owner=self.per_owner,
            )

    async def _attempt(self, client: httpx.AsyncClient, due: Due) -> None:
        started_at, clock = utcnow(), time.monotonic()
        try:
            status_code, error = await self._send(client, due, started_at)
        except asyncio.CancelledError:
            await anyio.to_thread.run_sync(self._release, due)
            raise
        except Exception:  # a bug: the lease stays, and the delivery is tried again once it lapses
            logger.exception("webhook delivery %d: the attempt failed", due.delivery_id)
            return
        duration_ms = int((time.monotonic() - clock) * 1000)
        try:
            outcome = await anyio.to_thread.run_sync(
                lambda: self._record(due, started_at, status_code, error, duration_ms)
            )
        except SQLAlchemyError as exc:  # the lease lapses and the delivery is tried again
            logger.warning(
                "webhook delivery %d: its outcome was not recorded (%s)", due.delivery_id, type(exc).__name__
            )
            return
        logger.info(
            "webhook delivery %d (%s) to endpoint %d, attempt %d: %s → %s",
            due.delivery_id,
            due.payload.get("type"),
            due.endpoint_id,
            due.attempt,
            status_code if error is None else error,
            outcome,
        )

    async def _send(
        self, client: httpx.AsyncClient, due: Due, started_at: datetime
    ) -> tuple[int | None, str | None]:
        """(status code, None) when the endpoint answered 2xx, else (status code or None, why not).
        The checked addresses are tried in the resolver's order while connections are refused; all
        of it before one deadline."""
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        late = f"no answer within {self.timeout_s:g}s (connect, headers and body together)"
        try:
            target = Target.parse(due.url)
            async with asyncio.timeout_at(deadline):
                addresses = await self._checked_addresses(target)
        except RefusedTarget as exc:
            return None, f"refused: {exc}"
        except TimeoutError:
            return None, late
        body = json.dumps(due.payload, separators=(",", ":"))
        headers = {
            **signed_headers(due.secret, message_id=due.message_id, timestamp=started_at, body=body),
            "content-type": "application/json",
            "user-agent": USER_AGENT,
            "host": _host_header(target),
        }
        # TLS checks the certificate against the URL's name, not the address connected to.
        extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
        failure = "no address to connect to"
        for address in addresses:
            host = f"[{address}]" if address.version == 6 else str(address)
            url = f"{target.scheme}://{host}:{target.port}{target.path}"
            answer: httpx.Response | None = None
            request = client.stream("POST", url, content=body, headers=headers, extensions=extensions)
            try:
                async with asyncio.timeout_at(deadline), request as answer:
                    await _read_some(answer.aiter_raw())
            except httpx.ConnectError as exc:
                failure = f"{type(exc).__name__}: {exc}"[:500]
                continue  # the next address, if any
            except (TimeoutError, httpx.TimeoutException):
                if answer is None:
                    return None, late
                # The status line and headers came in time and decide; the body was cut at the deadline.
            except httpx.HTTPError as exc:
                return None, f"{type(exc).__name__}: {exc}"[:500]
            if answer.is_redirect:
                return answer.status_code, "redirects are not followed"
            if not answer.is_success:
                return answer.status_code, f"HTTP {answer.status_code}"
            return answer.status_code, None
        return None, failure

    async def _checked_addresses(self, target: Target) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        literal = target.literal_address()
        if literal is not None:
            addresses = [literal]
        else:
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(
                    target.host, target.port, type=socket.SOCK_STREAM
                )
            except (OSError, UnicodeError) as exc:
                raise RefusedTarget(f"the host {target.host!r} does not resolve ({exc})") from None
            addresses = addresses_of(infos)
        return check_addresses(target, addresses, self.allow)

    def _record(
        self, due: Due, started_at: datetime, status_code: int | None, error: str | None, duration_ms: int
    ) -> object:
        with self.db.session() as session:
            return record_attempt(
                session,
                due=due,
                started_at=started_at,
                status_code=status_code,
                error=error,
                duration_ms=duration_ms,
                backoff=self.backoff,
            )

    def _release(self, due: Due) -> None:
        with contextlib.suppress(SQLAlchemyError), self.db.session() as session:
            release(session, due=due)


def _host_header(target: Target) -> str:
    host = f"[{target.host}]" if ":" in target.host else target.host
    default = 443 if target.scheme == "https" else 80
    return host if target.port == default else f"{host}:{target.port}"


async def _read_some(chunks: AsyncIterator[bytes]) -> None:
    read = 0
    async for chunk in chunks:
        read += len(chunk)
        if read >= MAX_ANSWER_BYTES:
            return


@contextlib.asynccontextmanager
async def dispatching(settings: Settings, db: Database) -> AsyncIterator[Dispatcher | None]:
    """The dispatcher running in the background for as long as the context lasts (the API's lifespan);
    None when GLUEJOBS_WEBHOOK_DISPATCH is off."""
    if not settings.webhook_dispatch:
        yield None
        return
    dispatcher = Dispatcher(settings, db)
    task = asyncio.create_task(dispatcher.run(), name="webhook-dispatcher")
    try:
        yield dispatcher
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
