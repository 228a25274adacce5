"""/v1/keys and /v1/audit: admins make, list, revoke and rotate keys, and read who changed what.

A key's secret is in the answer that makes it (create, rotate) and nowhere else: not in lists, logs,
events or the audit log, and the database keeps only its digest (service/accounts/api_keys.py). Keys are made
only while auth is on: with no key configured every caller is an anonymous admin, and a key minted
then would be a key anybody could have minted.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, status

from service.accounts import api_keys, audit
from service.accounts.auth import Principal
from service.deps import After, PrincipalDep, RowId, SessionDep
from service.schemas.common import ErrorResponse, Page
from service.schemas.keys import AuditEntryPublic, KeyCreate, KeyCreated, KeyList, KeyPublic
from service.schemas.owners import OwnerName
from shared.core.errors import Conflict

router = APIRouter(tags=["keys"])

KeyId = Annotated[RowId, Path(description="The key's id (GET /v1/keys)")]
Responses = dict[int | str, dict[str, Any]]
ADMIN_ONLY: Responses = {403: {"model": ErrorResponse, "description": "Not an admin key"}}
NO_AUTH: Responses = {
    409: {"model": ErrorResponse, "description": "Auth is off: set GLUEJOBS_ADMIN_KEYS first"}
}


def _may_make_keys(principal: Principal) -> None:
    principal.require_admin()
    if principal.owner is None:  # auth is off: every caller is this anonymous admin
        raise Conflict(
            "keys can be made only while auth is on: set GLUEJOBS_ADMIN_KEYS (an admin key such as "
            "admin=<key>) first, restart the API, and make keys with that key"
        )


@router.post("/keys", status_code=status.HTTP_201_CREATED, responses={**ADMIN_ONLY, **NO_AUTH})
def create_key(body: KeyCreate, session: SessionDep, principal: PrincipalDep) -> KeyCreated:
    """Make a key for `owner` (admin keys only). The answer holds its secret, shown this once."""
    _may_make_keys(principal)
    key, secret = api_keys.create_key(
        session,
        owner=body.owner,
        role=body.role,
        name=body.label,
        expires_at=body.expiry(),
        actor=principal.owner,
        actor_key_id=principal.key_id,
    )
    return KeyCreated.of(key, secret)


@router.get("/keys", responses=ADMIN_ONLY)
def read_keys(
    session: SessionDep,
    principal: PrincipalDep,
    owner: Annotated[OwnerName | None, Query(description="Only this owner's keys")] = None,
    include_revoked: Annotated[bool, Query(description="Revoked keys too")] = False,
) -> KeyList:
    """The stored keys, oldest first (configured keys are not listed: they live in the configuration)."""
    principal.require_admin()
    keys = api_keys.list_keys(session, owner=owner, include_revoked=include_revoked)
    return KeyList(data=[KeyPublic.model_validate(key) for key in keys])


KNOWN_KEY: Responses = {
    404: {"model": ErrorResponse},
    409: {"model": ErrorResponse, "description": "Already revoked"},
}


@router.delete("/keys/{key_id}", responses={**ADMIN_ONLY, **KNOWN_KEY})
def revoke_key(key_id: KeyId, session: SessionDep, principal: PrincipalDep) -> KeyPublic:
    """Revoke the key: the next request with it gets 401, on every API process. 409 if it already was."""
    principal.require_admin()
    key = api_keys.revoke_key(session, key_id=key_id, actor=principal.owner, actor_key_id=principal.key_id)
    return KeyPublic.model_validate(key)


@router.post(
    "/keys/{key_id}/rotate",
    status_code=status.HTTP_201_CREATED,
    responses={**ADMIN_ONLY, **KNOWN_KEY},
)
def rotate_key(key_id: KeyId, session: SessionDep, principal: PrincipalDep) -> KeyCreated:
    """A new key with the old one's owner, role, name and expiry (its secret shown once); the old key
    is revoked at once. The owner's jobs, sweeps and files are the new key's as they were the old one's."""
    _may_make_keys(principal)
    key, secret = api_keys.rotate_key(
        session, key_id=key_id, actor=principal.owner, actor_key_id=principal.key_id
    )
    return KeyCreated.of(key, secret)


@router.get("/audit", response_model=Page[AuditEntryPublic], responses=ADMIN_ONLY)
def read_audit(
    session: SessionDep,
    principal: PrincipalDep,
    limit: Annotated[int, Query(ge=1, le=100, description="Page size")] = 20,
    after: After = None,
) -> dict:
    """Key and quota changes, newest first, in cursor pages: who (owner and key id), what, when."""
    principal.require_admin()
    entries, has_more = audit.list_entries(session, after=after, limit=limit)
    return {
        "data": [AuditEntryPublic.of(entry) for entry in entries],
        "has_more": has_more,
        "next_cursor": str(entries[-1].id) if has_more and entries else None,
    }
