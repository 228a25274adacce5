"""`client.keys` and `client.audit`, sync and async (admin keys only): an admin's requests, each
built once, below, and sent through the client's I/O (resources/_transport.py)."""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Iterator
from typing import Any

from gluejobs._core import Call, query
from gluejobs._types import ApiKeyInfo, AuditEntry
from gluejobs.resources._transport import AsyncTransport, SyncTransport


def _create(owner: str, role: str, name: str | None, expires_in_days: float | None, expires_at: Any) -> Call:
    body = query(owner=owner, role=role, name=name, expires_in_days=expires_in_days)
    if expires_at is not None:
        body["expires_at"] = expires_at if isinstance(expires_at, str) else expires_at.isoformat()
    # Not sent again after a failure that may have reached the server: it would make a second key.
    return Call("POST", "/v1/keys", json=body, idempotent=False)


def _list(owner: str | None, include_revoked: bool) -> Call:
    revoked = "true" if include_revoked else None
    return Call("GET", "/v1/keys", params=query(owner=owner, include_revoked=revoked))


def _revoke(key_id: int) -> Call:
    return Call("DELETE", f"/v1/keys/{key_id}", idempotent=False)  # a repeat would answer 409


def _rotate(key_id: int) -> Call:
    return Call("POST", f"/v1/keys/{key_id}/rotate", idempotent=False)


def _audit(page_size: int) -> Call:
    return Call("GET", "/v1/audit", params={"limit": page_size})


class Keys:
    """`client.keys` (admin keys only): make, list, revoke and rotate keys."""

    def __init__(self, client: SyncTransport) -> None:
        self._c = client

    def create(
        self,
        *,
        owner: str,
        role: str = "user",
        name: str | None = None,
        expires_in_days: float | None = None,
        expires_at: Any = None,
    ) -> ApiKeyInfo:
        """A new key for `owner` (role user, admin or read-only); its `secret` is in this answer only."""
        return self._c._one(_create(owner, role, name, expires_in_days, expires_at), ApiKeyInfo)

    def list(self, *, owner: str | None = None, include_revoked: bool = False) -> builtins.list[ApiKeyInfo]:
        """The stored keys (never their secrets), oldest first."""
        return self._c._all(_list(owner, include_revoked), ApiKeyInfo)

    def revoke(self, key_id: int) -> ApiKeyInfo:
        """Revoke the key: its next request gets 401, on every API process."""
        return self._c._one(_revoke(key_id), ApiKeyInfo)

    def rotate(self, key_id: int) -> ApiKeyInfo:
        """A new key (same owner, role, name, expiry; its `secret` in this answer); the old one revoked."""
        return self._c._one(_rotate(key_id), ApiKeyInfo)


class AsyncKeys:
    """`client.keys` of AsyncClient: Keys' methods, awaited."""

    def __init__(self, client: AsyncTransport) -> None:
        self._c = client

    async def create(
        self,
        *,
        owner: str,
        role: str = "user",
        name: str | None = None,
        expires_in_days: float | None = None,
        expires_at: Any = None,
    ) -> ApiKeyInfo:
        return await self._c._one(_create(owner, role, name, expires_in_days, expires_at), ApiKeyInfo)

    async def list(
        self, *, owner: str | None = None, include_revoked: bool = False
    ) -> builtins.list[ApiKeyInfo]:
        return await self._c._all(_list(owner, include_revoked), ApiKeyInfo)

    async def revoke(self, key_id: int) -> ApiKeyInfo:
        return await self._c._one(_revoke(key_id), ApiKeyInfo)

    async def rotate(self, key_id: int) -> ApiKeyInfo:
        return await self._c._one(_rotate(key_id), ApiKeyInfo)


class Audit:
    """`client.audit` (admin keys only): who changed keys and quotas."""

    def __init__(self, client: SyncTransport) -> None:
        self._c = client

    def list(self, *, page_size: int = 100) -> Iterator[AuditEntry]:
        """Entries newest first, page after page."""
        return self._c._paginate(_audit(page_size), AuditEntry.from_json)


class AsyncAudit:
    """`client.audit` of AsyncClient."""

    def __init__(self, client: AsyncTransport) -> None:
        self._c = client

    def list(self, *, page_size: int = 100) -> AsyncIterator[AuditEntry]:
        return self._c._paginate(_audit(page_size), AuditEntry.from_json)
